// What a statement touches, from its text (replay/sync_sql.h).
#include "replay/sync_sql.h"

#include <algorithm>
#include <cctype>
#include <initializer_list>

namespace tierlab::replay::detail {
namespace {

enum class Tok : uint8_t { Word, Quoted, String, Number, Param, Punct };

struct Token {
  Tok t = Tok::Punct;
  std::string text;     // Word: lower case; Quoted, String: the contents; Param: its number; Punct: the character
  int depth = 0;        // parentheses around it ('(' and ')' count outside)
  bool usable = true;   // String: its text is its value (not an E'' string with escapes)
};

bool ident_char(char c) {
  const unsigned char u = static_cast<unsigned char>(c);
  return std::isalnum(u) || c == '_' || c == '$' || u >= 0x80;
}

// The statements of `sql`, split at top-level ';', as tokens.
std::vector<std::vector<Token>> tokenize(std::string_view sql) {
  std::vector<std::vector<Token>> out(1);
  int depth = 0;
  size_t i = 0;
  const size_t n = sql.size();
  auto push = [&](Tok t, std::string text, bool usable = true) {
    out.back().push_back(Token{t, std::move(text), depth, usable});
  };
  while (i < n) {
    const char c = sql[i];
    const unsigned char uc = static_cast<unsigned char>(c);
    if (std::isspace(uc)) {
      ++i;
    } else if (c == '-' && i + 1 < n && sql[i + 1] == '-') {
      while (i < n && sql[i] != '\n') ++i;
    } else if (c == '/' && i + 1 < n && sql[i + 1] == '*') {
      const size_t end = sql.find("*/", i + 2);
      i = end == std::string_view::npos ? n : end + 2;
    } else if (c == '\'') {
      // E'' strings take backslash escapes: their text is not their value.
      bool escapes = false;
      if (!out.back().empty() && out.back().back().t == Tok::Word && out.back().back().text == "e" && i > 0 &&
          (sql[i - 1] == 'e' || sql[i - 1] == 'E')) {
        escapes = true;
        out.back().pop_back();
      }
      std::string v;
      ++i;
      while (i < n) {
        if (escapes && sql[i] == '\\' && i + 1 < n) {
          v += sql.substr(i, 2);
          i += 2;
        } else if (sql[i] == '\'') {
          if (i + 1 < n && sql[i + 1] == '\'') {
            v += '\'';
            i += 2;
          } else {
            ++i;
            break;
          }
        } else {
          v += sql[i++];
        }
      }
      push(Tok::String, std::move(v), !escapes);
    } else if (c == '"') {
      std::string v;
      ++i;
      while (i < n) {
        if (sql[i] == '"') {
          if (i + 1 < n && sql[i + 1] == '"') {
            v += '"';
            i += 2;
            continue;
          }
          ++i;
          break;
        }
        v += sql[i++];
      }
      push(Tok::Quoted, std::move(v));
    } else if (c == '$' && i + 1 < n && std::isdigit(static_cast<unsigned char>(sql[i + 1]))) {
      size_t k = i + 1;
      while (k < n && std::isdigit(static_cast<unsigned char>(sql[k]))) ++k;
      push(Tok::Param, std::string(sql.substr(i + 1, k - i - 1)));
      i = k;
    } else if (c == '$') {
      // $tag$ ... $tag$
      const size_t close = sql.find('$', i + 1);
      bool tag_ok = close != std::string_view::npos;
      for (size_t k = i + 1; tag_ok && k < close; ++k)
        if (!ident_char(sql[k]) || sql[k] == '$') tag_ok = false;
      if (!tag_ok) {
        push(Tok::Punct, "$");
        ++i;
        continue;
      }
      const std::string_view tag = sql.substr(i, close - i + 1);
      const size_t end = sql.find(tag, close + 1);
      const size_t body_end = end == std::string_view::npos ? n : end;
      push(Tok::String, std::string(sql.substr(close + 1, body_end - close - 1)));
      i = end == std::string_view::npos ? n : end + tag.size();
    } else if (std::isdigit(uc) || (c == '.' && i + 1 < n && std::isdigit(static_cast<unsigned char>(sql[i + 1])))) {
      size_t k = i;
      while (k < n && (std::isalnum(static_cast<unsigned char>(sql[k])) || sql[k] == '.' || sql[k] == '_' ||
                       ((sql[k] == '+' || sql[k] == '-') && (sql[k - 1] == 'e' || sql[k - 1] == 'E'))))
        ++k;
      push(Tok::Number, std::string(sql.substr(i, k - i)));
      i = k;
    } else if (ident_char(c)) {
      size_t k = i;
      std::string w;
      while (k < n && ident_char(sql[k])) w += static_cast<char>(std::tolower(static_cast<unsigned char>(sql[k++])));
      push(Tok::Word, std::move(w));
      i = k;
    } else if (c == ';' && depth == 0) {
      if (!out.back().empty()) out.emplace_back();
      ++i;
    } else {
      if (c == ')') depth = std::max(0, depth - 1);
      push(Tok::Punct, std::string(1, c));
      if (c == '(') ++depth;
      ++i;
    }
  }
  if (out.back().empty()) out.pop_back();
  return out;
}

// Words that end a FROM item or a WHERE clause: never an alias nor a value's
// continuation.
bool clause_word(std::string_view w) {
  static constexpr std::string_view kWords[] = {
      "where", "join", "inner", "left", "right", "full", "cross", "natural", "on", "using", "group",
      "order", "limit", "offset", "fetch", "for", "union", "except", "intersect", "having", "window",
      "returning", "set", "lateral", "tablesample", "values", "select", "as", "and", "or", "into",
      "from", "with", "default", "do", "not", "is", "in", "between", "like", "ilike", "similar"};
  return std::find(std::begin(kWords), std::end(kWords), w) != std::end(kWords);
}

class StatementReader {
 public:
  StatementReader(const std::vector<Token>& v, std::span<const ParamValue> params, SqlAccess& out)
      : v_(v), params_(params), out_(out) {}

  void read();

 private:
  size_t size() const { return v_.size(); }
  bool word(size_t i, std::string_view w) const { return i < v_.size() && v_[i].t == Tok::Word && v_[i].text == w; }
  bool punct(size_t i, char c) const { return i < v_.size() && v_[i].t == Tok::Punct && v_[i].text[0] == c; }
  bool name_tok(size_t i) const {
    return i < v_.size() && (v_[i].t == Tok::Quoted || (v_[i].t == Tok::Word && !clause_word(v_[i].text)));
  }
  // Skips the words given, in any order and number, from i.
  size_t skip(size_t i, std::initializer_list<std::string_view> words) const {
    for (bool more = true; more;) {
      more = false;
      for (std::string_view w : words)
        if (word(i, w)) {
          ++i;
          more = true;
        }
    }
    return i;
  }
  // A relation name at i ([ONLY] a[.b[.c]]): its last part, and i past it.
  // `from_item`: in a FROM list, where a name followed by '(' is a function
  // call, not a relation (elsewhere a column list follows).
  bool relation(size_t& i, std::string& name, bool from_item = false) const {
    size_t k = skip(i, {"only"});
    if (!name_tok(k)) return false;
    std::string last = v_[k].text;
    ++k;
    while (punct(k, '.') && k + 1 < size() && (v_[k + 1].t == Tok::Word || v_[k + 1].t == Tok::Quoted)) {
      last = v_[k + 1].text;
      k += 2;
    }
    if (from_item && punct(k, '(')) return false;
    if (punct(k, '*')) ++k;  // a table's descendants
    name = std::move(last);
    i = k;
    return true;
  }
  // Skips an alias ([AS] name) at i.
  size_t alias(size_t i) const {
    if (word(i, "as")) ++i;
    if (name_tok(i)) ++i;
    if (punct(i, '(') && i > 0 && v_[i - 1].t != Tok::Punct) {  // column aliases
      const int d = v_[i].depth;
      ++i;
      while (i < size() && !(punct(i, ')') && v_[i].depth == d)) ++i;
      ++i;
    }
    return i;
  }
  RelAccess& add(std::string name, AccessKind k) {
    out_.rels.push_back(RelAccess{std::move(name), k, {}});
    return out_.rels.back();
  }
  // Every relation after FROM, JOIN or USING from `from` on (a list after
  // FROM and USING), as `kind`; skips the one target at `skip_at`. Returns
  // how many relations the top level (depth `top`) names, and in `top_at`
  // the index in out_.rels of the last of them.
  int sources(size_t from, AccessKind kind, int top, size_t skip_at = SIZE_MAX, size_t* top_at = nullptr);
  // The equalities of the top-level WHERE (depth `top`) after `from`.
  std::vector<Equality> where_keys(size_t from, int top) const;
  // The function calls the statement makes that touch state.
  void functions();
  bool has_top(std::string_view w, int top, size_t from = 0) const {
    for (size_t i = from; i < size(); ++i)
      if (v_[i].depth == top && word(i, w)) return true;
    return false;
  }
  size_t find_top(std::string_view w, int top, size_t from = 0) const {
    for (size_t i = from; i < size(); ++i)
      if (v_[i].depth == top && word(i, w)) return i;
    return SIZE_MAX;
  }
  // The names listed from i: a[, b ...] (TRUNCATE, DROP, LOCK), as `kind`.
  void name_list(size_t i, AccessKind kind) {
    std::string name;
    while (relation(i, name)) {
      add(name, kind);
      if (!punct(i, ',')) return;
      ++i;
    }
  }
  void unknown() { out_.unknown = true; }

  void read_select();
  void read_insert();
  void read_update_delete(bool update);
  void read_copy();
  void read_create();
  void read_drop_alter(bool drop);

  const std::vector<Token>& v_;
  std::span<const ParamValue> params_;
  SqlAccess& out_;
};

int StatementReader::sources(size_t from, AccessKind kind, int top, size_t skip_at, size_t* top_at) {
  int at_top = 0;
  for (size_t i = from; i < size(); ++i) {
    const bool list = word(i, "from") || word(i, "using");
    if (!list && !word(i, "join")) continue;
    size_t k = i + 1;
    for (;;) {
      k = skip(k, {"lateral"});
      std::string name;
      const size_t at = k;
      if (!relation(k, name, true)) break;
      if (at != skip_at && skip(at, {"only"}) != skip_at) {
        add(name, kind);
        if (v_[i].depth == top) {
          ++at_top;
          if (top_at) *top_at = out_.rels.size() - 1;
        }
      }
      k = alias(k);
      if (!list || !punct(k, ',')) break;
      ++k;
    }
  }
  return at_top;
}

std::vector<Equality> StatementReader::where_keys(size_t from, int top) const {
  std::vector<Equality> keys;
  const size_t w = find_top("where", top, from);
  if (w == SIZE_MAX) return keys;
  static constexpr std::string_view kEnds[] = {"returning", "order", "group", "limit", "offset", "for",
                                               "having", "window", "union", "except", "intersect", "fetch"};
  auto ends = [&](size_t i) {
    if (i >= size()) return true;
    if (v_[i].depth < top) return true;
    if (v_[i].depth > top || v_[i].t != Tok::Word) return false;
    return std::find(std::begin(kEnds), std::end(kEnds), v_[i].text) != std::end(kEnds);
  };
  size_t end = w + 1;
  while (!ends(end)) {
    if (v_[end].depth == top && word(end, "or")) return {};
    ++end;
  }
  for (size_t i = w + 1; i < end; ++i) {
    if (v_[i].depth != top || !(word(i - 1, "where") || word(i - 1, "and")) || v_[i - 1].depth != top) continue;
    size_t k = i;
    if (!(v_[k].t == Tok::Word || v_[k].t == Tok::Quoted)) continue;
    std::string column = v_[k].text;
    ++k;
    while (punct(k, '.') && k + 1 < end && (v_[k + 1].t == Tok::Word || v_[k + 1].t == Tok::Quoted)) {
      column = v_[k + 1].text;
      k += 2;
    }
    if (!punct(k, '=') || k + 1 >= end) continue;
    ++k;
    bool negative = false;
    if (punct(k, '-') && k + 1 < end && v_[k + 1].t == Tok::Number) {
      negative = true;
      ++k;
    }
    std::optional<std::string> value;
    const Token& t = v_[k];
    if (t.t == Tok::Number || (t.t == Tok::String && t.usable)) {
      value = (negative ? "-" : "") + t.text;
    } else if (t.t == Tok::Param) {
      const size_t n = static_cast<size_t>(std::stoul(t.text.substr(0, 9)));
      if (n >= 1 && n <= params_.size() && params_[n - 1]) value = std::string(*params_[n - 1]);
    }
    if (!value) continue;
    ++k;
    // A cast (::type, ::type(n)) keeps the value.
    while (k + 2 < end && punct(k, ':') && punct(k + 1, ':') && v_[k + 2].t == Tok::Word) {
      k += 3;
      if (punct(k, '(')) {
        const int d = v_[k].depth;
        ++k;
        while (k < end && !(punct(k, ')') && v_[k].depth == d)) ++k;
        ++k;
      }
    }
    if (k < end && !(word(k, "and") && v_[k].depth == top)) continue;  // "a = 1 + b": not a key
    keys.push_back(Equality{column, key_value(*value)});
  }
  return keys;
}

void StatementReader::functions() {
  for (size_t i = 0; i + 1 < size(); ++i) {
    if (v_[i].t != Tok::Word || !punct(i + 1, '(')) continue;
    if (i > 0 && punct(i - 1, '.')) continue;  // schema.f: only pg_catalog's are known below
    const std::string& f = v_[i].text;
    const bool seq_write = f == "nextval" || f == "setval";
    if (seq_write || f == "currval") {
      // The sequence by name: 'name' or 'schema.name' (a regclass literal).
      if (i + 2 < size() && v_[i + 2].t == Tok::String && v_[i + 2].usable) {
        std::string name = v_[i + 2].text;
        const size_t dot = name.rfind('.');
        if (dot != std::string::npos) name = name.substr(dot + 1);
        if (name.size() >= 2 && name.front() == '"' && name.back() == '"') {
          name = name.substr(1, name.size() - 2);
        } else {
          for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        }
        add(name, seq_write ? AccessKind::Write : AccessKind::Read);
      } else {
        unknown();
      }
    } else if (f == "lastval" || f == "pg_notify" || f.rfind("pg_advisory", 0) == 0 ||
               f.rfind("pg_try_advisory", 0) == 0) {
      unknown();
    }
  }
}

void StatementReader::read_select() {
  // SELECT ... INTO a table creates it: not read here.
  if (has_top("into", 0)) return unknown();
  if (word(0, "table")) {
    size_t i = 1;
    std::string name;
    if (!relation(i, name)) return unknown();
    add(name, AccessKind::Read);
    return;
  }
  const size_t before = out_.rels.size();
  size_t top_at = 0;
  const int top = sources(0, AccessKind::Read, 0, SIZE_MAX, &top_at);
  // FOR UPDATE / SHARE / NO KEY UPDATE / KEY SHARE: rows locked as for a write.
  for (size_t i = 0; i + 1 < size(); ++i)
    if (v_[i].depth == 0 && word(i, "for") &&
        (word(i + 1, "update") || word(i + 1, "share") || word(i + 1, "no") || word(i + 1, "key")))
      for (size_t r = before; r < out_.rels.size(); ++r) out_.rels[r].kind = AccessKind::Write;
  // One relation at the top and no join: the WHERE's equalities are its.
  if (top == 1 && !has_top("join", 0) && !has_top("union", 0) && !has_top("except", 0) &&
      !has_top("intersect", 0))
    out_.rels[top_at].keys = where_keys(0, 0);
  functions();
}

void StatementReader::read_insert() {
  size_t i = 1;
  if (!word(i, "into")) return unknown();
  ++i;
  std::string name;
  const size_t target = i;
  if (!relation(i, name)) return unknown();
  // ON CONFLICT reads and updates rows there; RETURNING hands the client
  // values a default (a sequence) gave, in the order the inserts ran.
  const bool write = has_top("conflict", 0) || has_top("returning", 0);
  add(name, write ? AccessKind::Write : AccessKind::Append);
  sources(i, AccessKind::Read, 0, target);
  functions();
}

void StatementReader::read_update_delete(bool update) {
  size_t i = 1;
  if (!update) {
    if (!word(i, "from")) return unknown();
    ++i;
  }
  std::string name;
  const size_t target = i;
  if (!relation(i, name)) return unknown();
  const size_t at = out_.rels.size();
  add(name, AccessKind::Write);
  // Rows of other relations (UPDATE ... FROM, DELETE ... USING) may decide
  // which rows change: the WHERE's columns are not surely the target's.
  const bool joined = has_top(update ? "from" : "using", 0, i);
  std::vector<Equality> keys = joined ? std::vector<Equality>{} : where_keys(i, 0);
  if (update) {
    // A key the SET assigns moves the row: no key.
    const size_t set = find_top("set", 0, i);
    const size_t stop = std::min({find_top("where", 0, i), find_top("from", 0, i), find_top("returning", 0, i)});
    const size_t last = std::min(stop, size());
    for (size_t k = set == SIZE_MAX ? size() : set + 1; k < last; ++k) {
      if (v_[k].depth == 0 && punct(k, '(') && (punct(k - 1, ',') || word(k - 1, "set"))) keys.clear();
      if (v_[k].depth != 0 || !(v_[k].t == Tok::Word || v_[k].t == Tok::Quoted) || !punct(k + 1, '=')) continue;
      std::erase_if(keys, [&](const Equality& e) { return e.column == v_[k].text; });
    }
    // Increments only: c = c + x, c = c - x, x one literal or parameter
    // (a cast allowed), separated by commas.
    bool add = set != SIZE_MAX && !joined && !has_top("returning", 0, i);
    for (size_t k = set + 1; add && k < last;) {
      const bool name = v_[k].t == Tok::Word || v_[k].t == Tok::Quoted;
      add = name && k + 4 < last + 1 && punct(k + 1, '=') && v_[k + 2].t == v_[k].t && v_[k + 2].text == v_[k].text &&
            (punct(k + 3, '+') || punct(k + 3, '-')) && k + 4 < last &&
            (v_[k + 4].t == Tok::Param || v_[k + 4].t == Tok::Number || v_[k + 4].t == Tok::String);
      k += 5;
      while (add && k + 2 < last && punct(k, ':') && punct(k + 1, ':') && v_[k + 2].t == Tok::Word) k += 3;
      if (add && k < last) add = punct(k, ',') && ++k < last;
    }
    if (add) out_.rels[at].kind = AccessKind::Add;
  }
  sources(i, AccessKind::Read, 0, target);
  out_.rels[at].keys = std::move(keys);
  functions();
}

void StatementReader::read_copy() {
  size_t i = 1;
  std::string name;
  if (relation(i, name)) {
    if (punct(i, '(')) {  // column list
      const int d = v_[i].depth;
      ++i;
      while (i < size() && !(punct(i, ')') && v_[i].depth == d)) ++i;
      ++i;
    }
    if (word(i, "from")) add(name, AccessKind::Append);
    else if (word(i, "to")) add(name, AccessKind::Read);
    else unknown();
    return;
  }
  if (!punct(1, '(')) return unknown();
  sources(1, AccessKind::Read, 1);
  functions();
}

void StatementReader::read_create() {
  size_t i = skip(1, {"or", "replace", "temp", "temporary", "unlogged", "global", "local", "unique"});
  std::string name;
  if (word(i, "table")) {
    i = skip(i + 1, {"if", "not", "exists"});
    if (!relation(i, name)) return unknown();
    add(name, AccessKind::Write);
  } else if (word(i, "sequence")) {
    i = skip(i + 1, {"if", "not", "exists"});
    if (!relation(i, name)) return unknown();
    add(name, AccessKind::Write);
    return;
  } else if (word(i, "index")) {
    i = skip(i + 1, {"concurrently", "if", "not", "exists"});
    if (!word(i, "on") && relation(i, name)) add(name, AccessKind::Write);
    if (!word(i, "on")) return unknown();
    ++i;
    if (!relation(i, name)) return unknown();
    add(name, AccessKind::Write);
    return;
  } else {
    return unknown();
  }
  // CREATE TABLE: the relations a foreign key references, LIKE copies, AS
  // reads.
  for (size_t k = i; k < size(); ++k) {
    if (!word(k, "references") && !word(k, "like")) continue;
    size_t r = k + 1;
    if (relation(r, name)) add(name, word(k, "references") ? AccessKind::Write : AccessKind::Read);
  }
  sources(i, AccessKind::Read, 0);
  functions();
}

void StatementReader::read_drop_alter(bool drop) {
  size_t i = 1;
  if (!(word(i, "table") || word(i, "sequence") || word(i, "index"))) return unknown();
  i = skip(i + 1, {"concurrently", "if", "exists"});
  if (drop) return name_list(i, AccessKind::Write);
  std::string name;
  if (!relation(i, name)) return unknown();
  add(name, AccessKind::Write);
  for (size_t k = i; k < size(); ++k) {
    size_t r = k + 1;
    if (word(k, "references") && relation(r, name)) add(name, AccessKind::Write);
  }
}

void StatementReader::read() {
  if (v_.empty()) return;
  if (v_[0].t != Tok::Word) return unknown();
  const std::string& w = v_[0].text;
  if (w == "select" || w == "values" || w == "table") return read_select();
  if (w == "insert") return read_insert();
  if (w == "update") return read_update_delete(true);
  if (w == "delete") return read_update_delete(false);
  if (w == "copy") return read_copy();
  if (w == "create") return read_create();
  if (w == "drop") return read_drop_alter(true);
  if (w == "alter") return read_drop_alter(false);
  if (w == "truncate" || w == "lock") return name_list(skip(1, {"table"}), AccessKind::Write);
  if (w == "declare") {  // a cursor: what its query reads
    sources(1, AccessKind::Read, 0);
    return functions();
  }
  if (w == "explain") {  // EXPLAIN ANALYZE runs the statement
    for (const Token& t : v_)
      if (t.t == Tok::Word && (t.text == "analyze" || t.text == "analyse")) return unknown();
    return;
  }
  // COMMIT PREPARED and ROLLBACK PREPARED end another transaction.
  if ((w == "commit" || w == "rollback") && word(1, "prepared")) return unknown();
  static constexpr std::string_view kNothing[] = {
      "begin", "start", "commit", "end", "rollback", "abort", "savepoint", "release", "set", "reset", "show",
      "discard", "deallocate", "fetch", "move", "close", "checkpoint", "vacuum", "analyze", "analyse", "prepare"};
  if (std::find(std::begin(kNothing), std::end(kNothing), w) != std::end(kNothing)) return;
  unknown();
}

}  // namespace

std::string key_value(std::string_view v) {
  size_t i = 0;
  bool negative = false;
  if (i < v.size() && (v[i] == '+' || v[i] == '-')) negative = v[i++] == '-';
  if (i == v.size()) return std::string(v);
  for (size_t k = i; k < v.size(); ++k)
    if (!std::isdigit(static_cast<unsigned char>(v[k]))) return std::string(v);
  while (i + 1 < v.size() && v[i] == '0') ++i;
  std::string out = (negative && v.substr(i) != "0") ? "-" : "";
  out += v.substr(i);
  return out;
}

SqlAccess read_access(std::string_view sql, std::span<const ParamValue> params, bool prepare_only) {
  SqlAccess out;
  for (const std::vector<Token>& st : tokenize(sql)) StatementReader(st, params, out).read();
  if (prepare_only) {
    if (out.unknown) return {};
    for (RelAccess& r : out.rels) {
      r.kind = AccessKind::Schema;
      r.keys.clear();
    }
  }
  return out;
}

}  // namespace tierlab::replay::detail
