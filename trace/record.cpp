#include "trace/record.h"

namespace tierlab::trace {

std::string_view kind_name(Kind k) {
  switch (k) {
    case Kind::SessionBegin: return "session_begin";
    case Kind::SessionEnd: return "session_end";
    case Kind::Query: return "query";
    case Kind::Parse: return "parse";
    case Kind::Bind: return "bind";
    case Kind::Execute: return "execute";
    case Kind::Describe: return "describe";
    case Kind::Close: return "close";
    case Kind::Sync: return "sync";
    case Kind::Flush: return "flush";
    case Kind::CopyData: return "copy_data";
    case Kind::CopyDone: return "copy_done";
    case Kind::CopyFail: return "copy_fail";
    case Kind::Result: return "result";
    case Kind::Error: return "error";
    case Kind::Ready: return "ready";
    case Kind::BlockIo: return "block_io";
    case Kind::FileIo: return "file_io";
    case Kind::Sample: return "sample";
    case Kind::Meta: return "meta";
    case Kind::Loss: return "loss";
    case Kind::Count_: break;
  }
  return "unknown";
}

std::string_view op_name(IoOp op) {
  switch (op) {
    case IoOp::Read: return "read";
    case IoOp::Write: return "write";
    case IoOp::Flush: return "flush";
    case IoOp::Discard: return "discard";
  }
  return "unknown";
}

}  // namespace tierlab::trace
