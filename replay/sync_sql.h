// Private to replay/: what a statement touches, read from its SQL text, for
// the dependencies of replay --sync commit (replay/sync_plan.h).
//
// The reading is lexical (the statement's first words, the relations after
// FROM, JOIN, INTO, UPDATE, ON, TABLE, REFERENCES), not a parser: what it
// cannot place with certainty it calls unknown, and a transaction with an
// unknown statement waits for every commit before it, as if it touched
// everything. What the text does not show is not seen: a function's or a
// trigger's reads and writes, the tables behind a view, a foreign key's
// referenced rows (but for INSERTs: see AccessKind::Append).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tierlab::replay::detail {

// How a statement uses a relation. Two uses of one relation conflict (the
// order between them changes what one of them sees, or what they leave)
// unless both are Read, both Append, both Add, or one is Schema and the
// other not a whole-relation Write.
enum class AccessKind : uint8_t {
  Schema,  // only its definition: a Parse (prepared, not executed)
  Read,    // SELECT, COPY TO, the other relations of a DML statement
  Append,  // INSERT (without ON CONFLICT or RETURNING), COPY FROM: adds rows
  Write,   // UPDATE, DELETE, DDL, TRUNCATE, LOCK, SELECT FOR UPDATE, a
           // sequence's nextval/setval, INSERT ... ON CONFLICT or RETURNING
  Add,     // UPDATE whose every SET is `c = c + x` or `c = c - x` (x a
           // literal or parameter), without FROM or RETURNING: increments,
           // which leave the same rows and counts in either order
};

// `column = value` at the top level of a WHERE (ANDed, no OR): the rows the
// statement reads or writes all have this value in this column.
struct Equality {
  std::string column;
  std::string value;  // the literal or bound parameter, normalised (key_value)
};

struct RelAccess {
  std::string relation;  // lower case unless quoted; without its schema
  AccessKind kind = AccessKind::Read;
  // Read, Write: the statement's equalities on it when it is the only
  // relation the statement's rows come from (and, for UPDATE, the SET does
  // not assign the column).
  std::vector<Equality> keys;
};

struct SqlAccess {
  bool unknown = false;  // touches what the text does not tell
  std::vector<RelAccess> rels;
};

// A bound parameter's value: its text, or nullopt (NULL, or binary format:
// no key is taken from it).
using ParamValue = std::optional<std::string_view>;

// What `sql` (one or more statements, as sent) touches; `params` are the
// values of $1, $2, ... when it is executed with them. `prepare_only`: the
// statement is parsed, not executed (a Parse): every relation it names is a
// Schema use, and one that cannot be read is no use at all (a Parse runs
// nothing).
SqlAccess read_access(std::string_view sql, std::span<const ParamValue> params = {}, bool prepare_only = false);

// A key value as compared: an integer without sign '+' or leading zeros,
// anything else as written ("007" and 7 are one key; '7.0' and 7 are two).
std::string key_value(std::string_view v);

}  // namespace tierlab::replay::detail
