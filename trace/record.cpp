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
    case Kind::Suspended: return "portal_suspended";
    case Kind::EmptyQuery: return "empty_query";
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

Result split_command_tag(std::string_view tag) {
  Result r;
  auto numeric = [](std::string_view s) {
    if (s.empty() || s.size() > 20) return false;
    for (char c : s)
      if (c < '0' || c > '9') return false;
    return true;
  };
  std::string_view rest = tag;
  bool first = true;
  for (;;) {
    auto sp = rest.rfind(' ');
    if (sp == std::string_view::npos) break;
    std::string_view last = rest.substr(sp + 1);
    if (!numeric(last)) break;
    if (first) {
      uint64_t v = 0;
      for (char c : last) v = v * 10 + static_cast<uint64_t>(c - '0');
      r.rows = v;
      r.has_rows = true;
      first = false;
    }
    rest = rest.substr(0, sp);
  }
  r.tag = rest;
  return r;
}

}  // namespace tierlab::trace
