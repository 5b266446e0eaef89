// PostgreSQL server logs -> trace records (capture/log.h).
//
// Readers (log_read.cpp: stderr with a log_line_prefix, csvlog, jsonlog,
// pgreplay files) turn the input (log_source.cpp) into Entry values, one per
// logged message with its DETAIL and STATEMENT; the sessions' state machine
// (log_session.cpp) turns entries into records, one open unit per session.
#include "capture/log.h"

#include "capture/log_internal.h"
#include "common/error.h"

namespace tierlab::capture {

LogFormat parse_log_format(const std::string& s) {
  if (s == "auto") return LogFormat::Auto;
  if (s == "stderr") return LogFormat::Stderr;
  if (s == "csvlog" || s == "csv") return LogFormat::Csv;
  if (s == "jsonlog" || s == "json") return LogFormat::Json;
  if (s == "pgreplay") return LogFormat::Pgreplay;
  throw InputError("log format '" + s + "': expected stderr, csvlog, jsonlog or pgreplay");
}

LogCapture::LogCapture(const LogOptions& opts, OpenWriter open)
    : impl_(std::make_unique<Impl>(opts, std::move(open))) {}
LogCapture::~LogCapture() = default;

void LogCapture::read_file(const std::string& path) {
  logimpl::LogSource in(path);
  impl_->read(in, impl_->opts.format);
}

void LogCapture::read_text(const std::string& text, const std::string& name, LogFormat format) {
  logimpl::LogSource in(text, name);
  impl_->read(in, format);
}

LogStats LogCapture::finish() { return impl_->finish(); }

}  // namespace tierlab::capture
