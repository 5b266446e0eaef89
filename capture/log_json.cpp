// jsonlog records for `tierlab capture log`: the flat objects PostgreSQL
// writes, read without building a JSON document per line.
#include "capture/log_internal.h"

#include <cstring>

namespace tierlab::capture::logimpl {

namespace {

// The keys read, in JsonRecord::v's order.
constexpr std::string_view kKeys[JsonRecord::kKeys] = {
    "timestamp", "user",      "dbname",  "pid",     "remote_host",     "remote_port", "session_id",
    "error_severity", "state_code", "message", "detail", "statement", "application_name"};

int key_index(std::string_view k) {
  for (int i = 0; i < JsonRecord::kKeys; ++i)
    if (kKeys[i] == k) return i;
  return -1;
}

class Scan {
 public:
  Scan(std::string_view s, std::string& scratch) : p_(s.data()), end_(s.data() + s.size()), out_(scratch) {}

  void blanks() {
    while (p_ < end_ && (*p_ == ' ' || *p_ == '\t' || *p_ == '\r' || *p_ == '\n')) ++p_;
  }
  bool eat(char c) {
    blanks();
    if (p_ >= end_ || *p_ != c) return false;
    ++p_;
    return true;
  }
  bool at_end() {
    blanks();
    return p_ == end_;
  }
  char peek() {
    blanks();
    return p_ < end_ ? *p_ : 0;
  }

  // A string at p_ (after its opening quote is checked): a view of the
  // line, or of the scratch text for one with escapes. False for what the
  // general parser is to judge: \u escapes, bytes outside ASCII, control
  // characters, a string the line ends in.
  bool string(std::string_view& v) {
    if (!eat('"')) return false;
    const char* s = p_;
    for (; p_ < end_ && *p_ != '"' && *p_ != '\\'; ++p_)
      if (static_cast<unsigned char>(*p_) < 0x20 || static_cast<unsigned char>(*p_) >= 0x80) return false;
    if (p_ >= end_) return false;
    if (*p_ == '"') {
      v = {s, static_cast<size_t>(p_ - s)};
      ++p_;
      return true;
    }
    const size_t from = out_.size();
    out_.append(s, static_cast<size_t>(p_ - s));
    while (p_ < end_ && *p_ != '"') {
      const unsigned char c = static_cast<unsigned char>(*p_);
      if (c < 0x20 || c >= 0x80) return false;
      if (c != '\\') {
        out_ += *p_++;
        continue;
      }
      if (++p_ >= end_) return false;
      switch (*p_++) {
        case '"': out_ += '"'; break;
        case '\\': out_ += '\\'; break;
        case '/': out_ += '/'; break;
        case 'b': out_ += '\b'; break;
        case 'f': out_ += '\f'; break;
        case 'n': out_ += '\n'; break;
        case 'r': out_ += '\r'; break;
        case 't': out_ += '\t'; break;
        default: return false;  // \u and bad escapes
      }
    }
    if (p_ >= end_) return false;
    ++p_;
    v = std::string_view(out_).substr(from);
    return true;
  }

  // An integer at p_: its text (as a JSON document would print it).
  bool integer(std::string_view& v) {
    blanks();
    const char* s = p_;
    if (p_ < end_ && *p_ == '-') ++p_;
    const char* digits = p_;
    while (p_ < end_ && *p_ >= '0' && *p_ <= '9') ++p_;
    if (p_ == digits || (*digits == '0' && p_ - digits > 1) || p_ - digits > 18) return false;
    if (p_ < end_ && (*p_ == '.' || *p_ == 'e' || *p_ == 'E')) return false;  // not an integer
    if (s[0] == '-' && p_ - digits == 1 && *digits == '0') return false;       // -0
    v = {s, static_cast<size_t>(p_ - s)};
    return true;
  }

  bool word(std::string_view w) {
    blanks();
    if (static_cast<size_t>(end_ - p_) < w.size() || std::memcmp(p_, w.data(), w.size()) != 0) return false;
    p_ += w.size();
    return true;
  }

 private:
  const char* p_;
  const char* end_;
  std::string& out_;
};

}  // namespace

bool parse_json_plain(std::string_view line, JsonRecord& r, std::string& scratch) {
  scratch.clear();
  scratch.reserve(line.size());  // unescaped text is shorter: views into it stay valid
  for (std::string_view& v : r.v) v = {};
  Scan in(line, scratch);
  if (!in.eat('{')) return false;
  unsigned seen = 0;
  if (in.peek() != '}') {
    for (;;) {
      std::string_view key, value;
      if (!in.string(key) || !in.eat(':')) return false;
      const char c = in.peek();
      if (c == '"') {
        if (!in.string(value)) return false;
      } else if (c == '-' || (c >= '0' && c <= '9')) {
        if (!in.integer(value)) return false;
      } else if (!(in.word("true") || in.word("false") || in.word("null"))) {
        return false;  // an object, an array or not JSON
      }
      const int k = key_index(key);
      if (k >= 0) {
        if (seen & (1u << k)) return false;  // a key twice
        seen |= 1u << k;
        r.v[k] = value;  // true, false and null read as ""
      }
      if (in.eat(',')) continue;
      if (!in.eat('}')) return false;
      break;
    }
  } else {
    in.eat('}');
  }
  return in.at_end();
}

}  // namespace tierlab::capture::logimpl
