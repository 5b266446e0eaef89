// SQL statement text as tierlab compares it: the one fingerprint of a
// statement, shared by the workload profile (models/profile.h) and the
// replay's divergence report (replay/replay.h), so that both reports agree
// on what "the same statement" is.
#pragma once

#include <string>
#include <string_view>

namespace tierlab {

// The SQL text with literals (strings, E'' strings, dollar-quoted strings,
// numbers) and parameter markers ($1) replaced by '?', comments dropped,
// whitespace collapsed (a space kept only between words, and after ','),
// a trailing ';' dropped, and keywords and identifiers outside double
// quotes lower-cased. Two statements that differ only in their constants,
// or in being sent with parameters or literals, share it:
//   normalize_sql("SELECT a FROM t WHERE id = 42;") == "select a from t where id=?"
std::string normalize_sql(std::string_view sql);

}  // namespace tierlab
