// The frontend side of PostgreSQL's protocol 3.0, as the replay speaks it
// on connections it drives itself: request messages, encoded once when the
// plan is built, and the SQLSTATE of the server's ErrorResponse (row counts
// come from trace::split_command_tag, as the capture reads them). libpq
// still opens every connection (authentication, TLS, GSS); on a plaintext
// or TLS connection the engine then writes the plan's bytes and reads the
// answers without it.
#pragma once

#include "trace/record.h"

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace tierlab::replay::wire {

// Appends one message to `out`, laid out as libpq would send it.
void query(std::string& out, std::string_view sql);
void parse(std::string& out, std::string_view name, std::string_view sql, const uint32_t* types,
           int ntypes);
// Bind as the client sent it: its portal, every parameter with its format
// code, its result format codes.
void bind(std::string& out, std::string_view portal, std::string_view statement,
          std::span<const trace::Param> params, std::span<const int16_t> result_formats);
void describe(std::string& out, char target, std::string_view name);
void execute(std::string& out, std::string_view portal, uint32_t max_rows);
void close(std::string& out, char target, std::string_view name);
void sync(std::string& out);
void flush(std::string& out);
void copy_data(std::string& out, std::string_view data);
void copy_done(std::string& out);
void copy_fail(std::string& out, std::string_view message);

// Big-endian 32-bit integer at `p`.
inline uint32_t get32(const char* p) {
  const auto* u = reinterpret_cast<const unsigned char*>(p);
  return (uint32_t{u[0]} << 24) | (uint32_t{u[1]} << 16) | (uint32_t{u[2]} << 8) | u[3];
}

// The SQLSTATE field ('C') of an ErrorResponse body; "XX000" when the body
// (maybe cut short) has none. Writes five characters and a NUL.
void error_sqlstate(const char* body, size_t len, char out[6]);
// The primary message field ('M') of an ErrorResponse body, pointing into
// it: as much of it as `len` holds when the body was cut short; "" when the
// body has none.
std::string_view error_message(const char* body, size_t len);

}  // namespace tierlab::replay::wire
