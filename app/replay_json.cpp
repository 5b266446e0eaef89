#include "app/replay_json.h"

#include "common/error.h"
#include "replay/start_at.h"

namespace tierlab::app {
namespace {

using nlohmann::json;

json deltas_json(const std::vector<replay::FingerprintDelta>& v) {
  json a = json::array();
  for (const auto& d : v)
    a.push_back({{"sql", d.sql}, {"count", d.count}, {"captured_ms", d.captured_ms},
                 {"replay_ms", d.replay_ms}, {"delta_ms", d.replay_ms - d.captured_ms}});
  return a;
}

// Reading one report: each field named in the message when missing or of
// the wrong kind.
struct Fields {
  const json& root;
  const std::string& name;

  [[noreturn]] void bad(const std::string& path, const std::string& why) const {
    throw InputError(name + ": " + path + ": " + why + " (not a tierlab replay --json report of this version)");
  }
  const json& at(const json& o, const char* key, const std::string& path) const {
    if (!o.is_object() || !o.contains(key)) bad(path, "missing");
    return o.at(key);
  }
  uint64_t u64(const json& o, const char* key, const std::string& path) const {
    const json& v = at(o, key, path);
    if (!v.is_number_unsigned()) bad(path, "not a count");
    return v.get<uint64_t>();
  }
  int64_t i64(const json& o, const char* key, const std::string& path) const {
    const json& v = at(o, key, path);
    if (!v.is_number_integer()) bad(path, "not an integer");
    return v.get<int64_t>();
  }
  double num(const json& o, const char* key, const std::string& path) const {
    const json& v = at(o, key, path);
    if (!v.is_number()) bad(path, "not a number");
    return v.get<double>();
  }
  bool flag(const json& o, const char* key, const std::string& path) const {
    const json& v = at(o, key, path);
    if (!v.is_boolean()) bad(path, "not true or false");
    return v.get<bool>();
  }
  std::string str(const json& o, const char* key, const std::string& path, bool nullable = false) const {
    const json& v = at(o, key, path);
    if (nullable && v.is_null()) return "";
    if (!v.is_string()) bad(path, "not a string");
    return v.get<std::string>();
  }
  uint64_t u64(const char* key) const { return u64(root, key, key); }
  double num(const char* key) const { return num(root, key, key); }
  bool flag(const char* key) const { return flag(root, key, key); }
  std::string str(const char* key, bool nullable = false) const { return str(root, key, key, nullable); }
};

}  // namespace

json histogram_json(const Histogram& h) {
  json buckets = json::array();
  for (const auto& [i, n] : h.buckets()) buckets.push_back({i, n});
  return {{"unit", "ns"},
          {"sub_bucket_bits", Histogram::kSubBits},
          {"count", h.count()},
          {"sum", h.sum()},
          {"sum_squares", h.sum_squares()},
          {"min", h.min()},
          {"max", h.max()},
          {"buckets", buckets}};
}

std::optional<Histogram> histogram_from_json(const json& j) {
  try {
    if (j.at("unit") != "ns" || j.at("sub_bucket_bits") != Histogram::kSubBits) return std::nullopt;
    std::vector<std::pair<int, uint64_t>> buckets;
    for (const json& b : j.at("buckets")) {
      if (!b.is_array() || b.size() != 2 || !b[0].is_number_unsigned() || !b[1].is_number_unsigned())
        return std::nullopt;
      if (b[0].get<uint64_t>() >= static_cast<uint64_t>(Histogram::kBuckets)) return std::nullopt;
      buckets.emplace_back(b[0].get<int>(), b[1].get<uint64_t>());
    }
    const json &sum = j.at("sum"), &sumsq = j.at("sum_squares"), &min = j.at("min"), &max = j.at("max");
    if (!sum.is_number() || !sumsq.is_number() || !min.is_number_integer() || !max.is_number_integer())
      return std::nullopt;
    auto h = Histogram::from_buckets(buckets, sum.get<double>(), sumsq.get<double>(), min.get<int64_t>(),
                                     max.get<int64_t>());
    if (!h || h->count() != j.at("count").get<uint64_t>()) return std::nullopt;
    return h;
  } catch (const json::exception&) {
    return std::nullopt;
  }
}

json report_json(const replay::Report& r, double max_rate) {
  json errs = json::object();
  for (const auto& [state, n] : r.errors_by_sqlstate) errs[state] = n;
  // The first error of each SQLSTATE: the target's message, and the
  // statement (normalised) it answered, null when none did.
  json firsts = json::object();
  for (const auto& e : r.first_errors)
    firsts[e.sqlstate] = {{"message", e.message},
                          {"statement", e.statement.empty() ? json(nullptr) : json(e.statement)}};
  json fps = json::array();
  for (const auto& f : r.fingerprints)
    fps.push_back({{"sql", f.sql}, {"count", f.count}, {"pairs", f.pairs}, {"captured_ns", f.captured_ns},
                   {"replay_ns", f.replay_ns}});
  json merged = json::array();
  for (uint32_t k : r.merged_shards) merged.push_back(k);
  json j = {
      {"sessions", r.sessions},
      {"sessions_failed", r.sessions_failed},
      {"sessions_stopped", r.sessions_stopped},
      {"stopped", r.stopped.empty() ? json(nullptr) : json(r.stopped)},
      {"sessions_direct", r.sessions_direct},
      {"first_session_error", r.first_session_error},
      {"threads", r.threads},
      {"realtime", r.realtime},
      {"slice_ms", r.slice_ms},
      {"io", r.io},
      {"cpu_latency_held", r.cpu_latency_held},
      {"speed", r.max_speed ? json("max") : json(r.speed)},
      {"shard", {{"index", r.shard.index}, {"count", r.shard.count}}},
      {"merged_shards", merged},
      {"transactions", r.transactions},
      {"failed_transactions", r.failed_transactions},
      {"statements", r.statements},
      {"errors", r.errors},
      {"tps", r.tps},
      {"duration_s", r.duration_s},
      {"captured_duration_s", r.captured_duration_s},
      {"connect_s", r.connect_s},
      {"cpu_s", r.cpu_s},
      {"cpu_us_per_transaction",
       r.cpu_us_per_transaction() >= 0 ? json(r.cpu_us_per_transaction()) : json(nullptr)},
      {"latency_ms",
       {{"avg", r.lat_avg_ms}, {"stddev", r.lat_stddev_ms}, {"p50", r.lat_p50_ms},
        {"p90", r.lat_p90_ms}, {"p99", r.lat_p99_ms}, {"p999", r.lat_p999_ms}, {"max", r.lat_max_ms}}},
      {"lag_ms",
       {{"avg", r.lag_avg_ms}, {"p99", r.lag_p99_ms}, {"max", r.lag_max_ms},
        {"tierlab_p99", r.own_lag_p99_ms}, {"tierlab_max", r.own_lag_max_ms}}},
      {"errors_by_sqlstate", errs},
      {"first_errors", firsts},
      {"divergence",
       {{"error_status", r.divergence_error_status},
        {"row_count", r.divergence_row_count},
        {"failed_ok_at_capture", r.divergence_new_errors},
        {"rate", r.divergence_rate},
        {"max_rate", max_rate}}},
      {"unsupported", r.unsupported},
      {"slowed", deltas_json(r.slowed)},
      {"sped_up", deltas_json(r.sped_up)},
      {"histograms",
       {{"latency", histogram_json(r.lat_hist)},
        {"lag", histogram_json(r.lag_hist)},
        {"tierlab_lag", histogram_json(r.own_lag_hist)},
        {"sync_wait", histogram_json(r.sync_wait_hist)}}},
      {"fingerprints", fps},
  };
  if (r.start_at_ns)
    j["start"] = {{"at_ns", r.start_at_ns},
                  {"at", replay::format_realtime(r.start_at_ns)},
                  {"offset_ms", static_cast<double>(r.start_offset_ns) / 1e6},
                  {"offset_ns", r.start_offset_ns},
                  {"offset_max_ns", r.start_offset_max_ns},
                  {"clock", r.clock}};
  j["sync"] = {{"mode", !r.sync ? "none" : r.sync_all ? "all" : "commit"},
               {"timeout_s", r.sync_timeout_s},
               {"commit_points", r.commit_points},
               {"units_waited", r.sync_waits},
               {"wait_s", r.sync_wait_s},
               {"wait_p99_ms", r.sync_wait_p99_ms},
               {"wait_max_ms", r.sync_wait_max_ms},
               {"timeouts", r.sync_timeouts}};
  if (!r.log_path.empty()) j["log"] = {{"path", r.log_path}, {"lines", r.log_lines}, {"error", r.log_error}};
  return j;
}

replay::Report report_from_json(const json& j, const std::string& name, double* max_rate) {
  Fields f{j, name};
  if (!j.is_object()) f.bad("(top)", "not an object");
  replay::Report r;
  r.sessions = f.u64("sessions");
  r.sessions_failed = f.u64("sessions_failed");
  r.sessions_stopped = f.u64("sessions_stopped");
  r.stopped = f.str("stopped", true);
  r.sessions_direct = f.u64("sessions_direct");
  r.first_session_error = f.str("first_session_error");
  r.threads = static_cast<int>(f.u64("threads"));
  r.realtime = f.flag("realtime");
  r.slice_ms = f.num("slice_ms");
  r.io = f.str("io");
  r.cpu_latency_held = f.flag("cpu_latency_held");
  const json& speed = f.at(j, "speed", "speed");
  if (speed == "max") {
    r.max_speed = true;
  } else if (speed.is_number()) {
    r.speed = speed.get<double>();
  } else {
    f.bad("speed", "neither a number nor \"max\"");
  }
  const json& shard = f.at(j, "shard", "shard");
  r.shard.index = static_cast<uint32_t>(f.u64(shard, "index", "shard.index"));
  r.shard.count = static_cast<uint32_t>(f.u64(shard, "count", "shard.count"));
  if (r.shard.count == 0 || r.shard.index >= r.shard.count) f.bad("shard", "not a shard K of N");
  if (!f.at(j, "merged_shards", "merged_shards").empty())
    f.bad("merged_shards", "a merged report; merge the shards' own reports");
  r.transactions = f.u64("transactions");
  r.failed_transactions = f.u64("failed_transactions");
  r.statements = f.u64("statements");
  r.errors = f.u64("errors");
  r.duration_s = f.num("duration_s");
  r.captured_duration_s = f.num("captured_duration_s");
  r.connect_s = f.num("connect_s");
  r.cpu_s = f.num("cpu_s");
  const json& errs = f.at(j, "errors_by_sqlstate", "errors_by_sqlstate");
  if (!errs.is_object()) f.bad("errors_by_sqlstate", "not an object");
  const json& firsts = f.at(j, "first_errors", "first_errors");
  for (const auto& [state, n] : errs.items()) {
    if (!n.is_number_unsigned()) f.bad("errors_by_sqlstate." + state, "not a count");
    r.errors_by_sqlstate.emplace_back(state, n.get<uint64_t>());
    replay::FirstError e{state, n.get<uint64_t>(), "", ""};
    if (firsts.is_object() && firsts.contains(state)) {
      const std::string path = "first_errors." + state;
      e.message = f.str(firsts.at(state), "message", path + ".message");
      e.statement = f.str(firsts.at(state), "statement", path + ".statement", true);
    }
    r.first_errors.push_back(std::move(e));
  }
  // nlohmann's objects are sorted by key; a replay puts "other" last.
  auto other_last = [](auto& v) {
    std::stable_partition(v.begin(), v.end(), [](const auto& e) {
      if constexpr (std::is_same_v<std::decay_t<decltype(e)>, replay::FirstError>) return e.sqlstate != "other";
      else return e.first != "other";
    });
  };
  other_last(r.errors_by_sqlstate);
  other_last(r.first_errors);
  const json& div = f.at(j, "divergence", "divergence");
  r.divergence_error_status = f.u64(div, "error_status", "divergence.error_status");
  r.divergence_row_count = f.u64(div, "row_count", "divergence.row_count");
  r.divergence_new_errors = f.u64(div, "failed_ok_at_capture", "divergence.failed_ok_at_capture");
  if (max_rate) *max_rate = f.num(div, "max_rate", "divergence.max_rate");
  r.unsupported = f.u64("unsupported");
  const json& sync = f.at(j, "sync", "sync");
  const std::string mode = f.str(sync, "mode", "sync.mode");
  r.sync = mode == "commit" || mode == "all";
  r.sync_all = mode == "all";
  r.sync_timeout_s = f.num(sync, "timeout_s", "sync.timeout_s");
  r.commit_points = f.u64(sync, "commit_points", "sync.commit_points");
  r.sync_timeouts = f.u64(sync, "timeouts", "sync.timeouts");
  const json& hists = f.at(j, "histograms", "histograms");
  struct {
    const char* key;
    Histogram* h;
  } hs[] = {{"latency", &r.lat_hist}, {"lag", &r.lag_hist}, {"tierlab_lag", &r.own_lag_hist},
             {"sync_wait", &r.sync_wait_hist}};
  for (auto& [key, h] : hs) {
    auto got = histogram_from_json(f.at(hists, key, std::string("histograms.") + key));
    if (!got)
      f.bad(std::string("histograms.") + key,
            "not a histogram of this layout (" + std::to_string(Histogram::kSubBits) + " sub-bucket bits, ns)");
    *h = *got;
  }
  const json& fps = f.at(j, "fingerprints", "fingerprints");
  if (!fps.is_array()) f.bad("fingerprints", "not an array");
  for (size_t i = 0; i < fps.size(); ++i) {
    const std::string path = "fingerprints[" + std::to_string(i) + "]";
    const json& o = fps[i];
    r.fingerprints.push_back(replay::FingerprintTotals{
        f.str(o, "sql", path + ".sql"), f.u64(o, "count", path + ".count"), f.u64(o, "pairs", path + ".pairs"),
        f.num(o, "captured_ns", path + ".captured_ns"), f.num(o, "replay_ns", path + ".replay_ns")});
  }
  if (j.contains("log")) {
    const json& log = j.at("log");
    r.log_path = f.str(log, "path", "log.path");
    r.log_lines = f.u64(log, "lines", "log.lines");
    r.log_error = f.str(log, "error", "log.error");
  }
  if (j.contains("start")) {
    const json& st = j.at("start");
    r.start_at_ns = f.i64(st, "at_ns", "start.at_ns");
    r.start_offset_ns = f.i64(st, "offset_ns", "start.offset_ns");
    r.start_offset_max_ns = f.i64(st, "offset_max_ns", "start.offset_max_ns");
    r.clock = f.str(st, "clock", "start.clock");
  }
  replay::derive(r);
  return r;
}

}  // namespace tierlab::app
