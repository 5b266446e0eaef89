#include "capture/activity.h"

#include <cstdlib>

namespace tierlab::capture {

const char* const kActivitySql =
    "SELECT coalesce(wait_event_type, 'CPU'), coalesce(wait_event, 'running'), count(*)"
    " FROM pg_stat_activity"
    " WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
    " AND state IN ('active', 'idle in transaction', 'idle in transaction (aborted)', 'fastpath function call')"
    " GROUP BY 1, 2";

namespace {

std::string name_part(std::string s) {
  for (auto& c : s)
    if (c == ' ' || c == '.') c = '_';
  return s;
}

// The role sees other users' backends' states (pg_read_all_stats), or owns
// every backend there is.
constexpr const char* kSeesAllSql =
    "SELECT pg_has_role(current_user, 'pg_read_all_stats', 'USAGE')"
    " OR NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE backend_type = 'client backend'"
    " AND usename IS DISTINCT FROM current_user)";

}  // namespace

std::vector<std::pair<std::string, double>> activity_samples(const std::vector<std::vector<std::string>>& rows) {
  std::vector<std::pair<std::string, double>> out;
  double backends = 0;
  for (const auto& r : rows) {
    if (r.size() < 3 || r[0].empty() || r[1].empty()) continue;
    char* end = nullptr;
    const double n = std::strtod(r[2].c_str(), &end);
    if (end == r[2].c_str() || *end != '\0' || !(n >= 0)) continue;
    backends += n;
    out.push_back({"pg.activity." + name_part(r[0]) + "." + name_part(r[1]), n});
  }
  out.insert(out.begin(), {"pg.activity.backends", backends});
  return out;
}

ActivitySampler::ActivitySampler(SqlQuery query, std::function<void(const std::string&)> say)
    : query_(std::move(query)), say_(std::move(say)) {}

bool ActivitySampler::sample(std::vector<std::pair<std::string, double>>& out) {
  if (!on_) return false;
  std::string err;
  if (!query_(kActivitySql, rows_, err)) {
    on_ = false;
    say_("pg_stat_activity not sampled: " + err + " (the profile has no split of transaction time by wait)");
    return false;
  }
  if (!checked_privileges_) {
    checked_privileges_ = true;
    std::vector<std::vector<std::string>> r;
    if (query_(kSeesAllSql, r, err) && !r.empty() && !r[0].empty() && r[0][0] == "f")
      say_("pg_stat_activity: the role sees only its own backends' waits (grant it pg_monitor)");
  }
  auto s = activity_samples(rows_);
  out.insert(out.end(), s.begin(), s.end());
  return true;
}

}  // namespace tierlab::capture
