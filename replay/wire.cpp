#include "replay/wire.h"

#include <cstring>

namespace tierlab::replay::wire {
namespace {

void put32(std::string& out, uint32_t v) {
  char b[4] = {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
               static_cast<char>(v)};
  out.append(b, 4);
}
void put16(std::string& out, uint32_t v) {
  char b[2] = {static_cast<char>(v >> 8), static_cast<char>(v)};
  out.append(b, 2);
}
void put_str(std::string& out, std::string_view s) {
  out.append(s);
  out.push_back('\0');
}

// Starts a message; end() fills in its length.
size_t begin(std::string& out, char type) {
  out.push_back(type);
  size_t at = out.size();
  put32(out, 0);
  return at;
}
void end(std::string& out, size_t at) {
  uint32_t len = static_cast<uint32_t>(out.size() - at);
  out[at] = static_cast<char>(len >> 24);
  out[at + 1] = static_cast<char>(len >> 16);
  out[at + 2] = static_cast<char>(len >> 8);
  out[at + 3] = static_cast<char>(len);
}

}  // namespace

void query(std::string& out, std::string_view sql) {
  size_t m = begin(out, 'Q');
  put_str(out, sql);
  end(out, m);
}

void parse(std::string& out, std::string_view name, std::string_view sql, const uint32_t* types,
           int ntypes) {
  size_t m = begin(out, 'P');
  put_str(out, name);
  put_str(out, sql);
  put16(out, static_cast<uint32_t>(ntypes));
  for (int i = 0; i < ntypes; ++i) put32(out, types[i]);
  end(out, m);
}

void bind(std::string& out, std::string_view portal, std::string_view statement,
          std::span<const trace::Param> params, std::span<const int16_t> result_formats) {
  size_t m = begin(out, 'B');
  put_str(out, portal);
  put_str(out, statement);
  put16(out, static_cast<uint32_t>(params.size()));
  for (const trace::Param& p : params) put16(out, static_cast<uint16_t>(p.format));
  put16(out, static_cast<uint32_t>(params.size()));
  for (const trace::Param& p : params) {
    if (p.is_null) {
      put32(out, 0xffffffffu);
      continue;
    }
    put32(out, static_cast<uint32_t>(p.value.size()));
    out.append(p.value);
  }
  put16(out, static_cast<uint32_t>(result_formats.size()));
  for (int16_t f : result_formats) put16(out, static_cast<uint16_t>(f));
  end(out, m);
}

void describe(std::string& out, char target, std::string_view name) {
  size_t m = begin(out, 'D');
  out.push_back(target);
  put_str(out, name);
  end(out, m);
}

void execute(std::string& out, std::string_view portal, uint32_t max_rows) {
  size_t m = begin(out, 'E');
  put_str(out, portal);
  put32(out, max_rows);
  end(out, m);
}

void close(std::string& out, char target, std::string_view name) {
  size_t m = begin(out, 'C');
  out.push_back(target);
  put_str(out, name);
  end(out, m);
}

void sync(std::string& out) { end(out, begin(out, 'S')); }

void flush(std::string& out) { end(out, begin(out, 'H')); }

void copy_data(std::string& out, std::string_view data) {
  size_t m = begin(out, 'd');
  out.append(data);
  end(out, m);
}

void copy_done(std::string& out) { end(out, begin(out, 'c')); }

void copy_fail(std::string& out, std::string_view message) {
  size_t m = begin(out, 'f');
  put_str(out, message);
  end(out, m);
}

void error_sqlstate(const char* body, size_t len, char out[6]) {
  std::memcpy(out, "XX000", 6);
  size_t i = 0;
  while (i < len && body[i] != '\0') {
    char field = body[i++];
    size_t start = i;
    while (i < len && body[i] != '\0') ++i;
    if (i >= len) return;  // cut short
    if (field == 'C' && i - start == 5) {
      std::memcpy(out, body + start, 5);
      return;
    }
    ++i;
  }
}

std::string_view error_message(const char* body, size_t len) {
  size_t i = 0;
  while (i < len && body[i] != '\0') {
    char field = body[i++];
    size_t start = i;
    while (i < len && body[i] != '\0') ++i;
    if (field == 'M') return std::string_view(body + start, i - start);
    ++i;
  }
  return {};
}

}  // namespace tierlab::replay::wire
