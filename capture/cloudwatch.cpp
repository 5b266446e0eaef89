#include "capture/cloudwatch.h"

#include "common/error.h"
#include "common/units.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <ctime>
#include <map>

namespace tierlab::capture {

namespace {

struct Known {
  const char* metric;  // normalised: lower case, no '_', '-', ' '
  const char* sample;
};

constexpr Known kKnown[] = {
    {"readiops", "provider.read_iops"},
    {"writeiops", "provider.write_iops"},
    {"readlatency", "provider.read_latency_s"},
    {"writelatency", "provider.write_latency_s"},
    {"readthroughput", "provider.read_bytes_per_s"},
    {"writethroughput", "provider.write_bytes_per_s"},
    {"diskqueuedepth", "provider.queue_depth"},
    {"cpuutilization", "provider.cpu_percent"},
    {"freeablememory", "provider.freeable_memory_bytes"},
};

std::string normalised(std::string_view s) {
  std::string out;
  for (char c : s)
    if (c != '_' && c != '-' && c != ' ') out.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  return out;
}

const char* known_sample(std::string_view name) {
  const std::string n = normalised(name);
  for (const auto& k : kKnown)
    if (n == k.metric) return k.sample;
  return nullptr;
}

// A key of `j` matched case-insensitively, or nullptr.
const nlohmann::json* key(const nlohmann::json& j, std::string_view name) {
  if (!j.is_object()) return nullptr;
  for (auto it = j.begin(); it != j.end(); ++it)
    if (normalised(it.key()) == normalised(name)) return &it.value();
  return nullptr;
}

std::string text_of(const nlohmann::json* j) {
  return j && j->is_string() ? j->get<std::string>() : std::string();
}

int digits(std::string_view s, size_t at, size_t n, bool& ok) {
  int v = 0;
  for (size_t i = at; i < at + n; ++i) {
    if (i >= s.size() || !std::isdigit(static_cast<unsigned char>(s[i]))) {
      ok = false;
      return 0;
    }
    v = v * 10 + (s[i] - '0');
  }
  return v;
}

// The instance's vCPUs and memory from the file's own keys.
void metadata(const nlohmann::json& root, const std::string& name, CloudWatchData& d) {
  for (const nlohmann::json* scope : {&root, key(root, "Metadata")}) {
    if (!scope) continue;
    if (const auto* v = key(*scope, "vcpus")) {
      if (!v->is_number_integer() || v->get<int64_t>() <= 0 || v->get<int64_t>() > 100000)
        throw InputError(name + ": vcpus: " + v->dump() + " is not a count of CPUs");
      d.vcpus = static_cast<int>(v->get<int64_t>());
    }
    if (const auto* v = key(*scope, "memory")) {
      if (v->is_number() && v->get<double>() > 0)
        d.memory_bytes = v->get<double>();
      else if (v->is_string())
        d.memory_bytes = static_cast<double>(parse_size(name + ": memory", v->get<std::string>()));
      else
        throw InputError(name + ": memory: " + v->dump() + " is not a size");
    }
  }
}

}  // namespace

size_t CloudWatchData::datapoints() const {
  size_t n = 0;
  for (const auto& s : series) n += s.points.size();
  return n;
}

bool parse_iso8601(std::string_view s, int64_t& ns) {
  bool ok = true;
  std::tm tm{};
  tm.tm_year = digits(s, 0, 4, ok) - 1900;
  if (s.size() < 19 || s[4] != '-' || s[7] != '-' || (s[10] != 'T' && s[10] != 't' && s[10] != ' ') ||
      s[13] != ':' || s[16] != ':')
    return false;
  tm.tm_mon = digits(s, 5, 2, ok) - 1;
  tm.tm_mday = digits(s, 8, 2, ok);
  tm.tm_hour = digits(s, 11, 2, ok);
  tm.tm_min = digits(s, 14, 2, ok);
  tm.tm_sec = digits(s, 17, 2, ok);
  if (!ok || tm.tm_mon < 0 || tm.tm_mon > 11 || tm.tm_mday < 1 || tm.tm_mday > 31 || tm.tm_hour > 23 ||
      tm.tm_min > 59 || tm.tm_sec > 60)
    return false;
  size_t i = 19;
  int64_t frac = 0;
  if (i < s.size() && s[i] == '.') {
    int64_t scale = 100'000'000;
    for (++i; i < s.size() && std::isdigit(static_cast<unsigned char>(s[i])); ++i) {
      frac += (s[i] - '0') * scale;
      scale /= 10;
    }
  }
  int64_t offset_s = 0;
  if (i < s.size()) {
    if (s[i] == 'Z' || s[i] == 'z') {
      ++i;
    } else if (s[i] == '+' || s[i] == '-') {
      const int sign = s[i] == '-' ? -1 : 1;
      const int h = digits(s, i + 1, 2, ok);
      size_t m_at = i + 3;
      if (m_at < s.size() && s[m_at] == ':') ++m_at;
      const int m = digits(s, m_at, 2, ok);
      if (!ok || h > 23 || m > 59) return false;
      offset_s = sign * (h * 3600 + m * 60);
      i = m_at + 2;
    } else {
      return false;
    }
  }
  if (i != s.size()) return false;
  const time_t t = timegm(&tm);
  ns = (static_cast<int64_t>(t) - offset_s) * 1'000'000'000 + frac;
  return true;
}

CloudWatchData parse_cloudwatch(std::string_view text, const std::string& name) {
  nlohmann::json root;
  try {
    root = nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::parse_error& e) {
    throw InputError(name + ": not JSON (at byte " + std::to_string(e.byte) +
                     "): not the output of aws cloudwatch get-metric-data");
  }
  const nlohmann::json* results = key(root, "MetricDataResults");
  if (!results || !results->is_array())
    throw InputError(name + ": no MetricDataResults array: not the output of aws cloudwatch get-metric-data");
  CloudWatchData d;
  metadata(root, name, d);
  // Id -> MetricStat.Metric.MetricName of the queries, when kept in the file.
  std::map<std::string, std::string> metric_of;
  if (const auto* q = key(root, "MetricDataQueries"); q && q->is_array())
    for (const auto& e : *q) {
      std::string id = text_of(key(e, "Id"));
      const auto* ms = key(e, "MetricStat");
      const auto* m = ms ? key(*ms, "Metric") : nullptr;
      std::string metric = text_of(m ? key(*m, "MetricName") : nullptr);
      if (!id.empty() && !metric.empty()) metric_of[id] = metric;
    }
  std::map<std::string, std::string> taken;  // sample name -> the label that gave it
  double period_ns = 0;
  bool any_point = false;
  for (size_t r = 0; r < results->size(); ++r) {
    const auto& res = (*results)[r];
    const std::string where = name + ": MetricDataResults[" + std::to_string(r) + "]";
    if (!res.is_object()) throw InputError(where + ": not an object");
    const std::string id = text_of(key(res, "Id")), label = text_of(key(res, "Label"));
    const auto* ts = key(res, "Timestamps");
    const auto* vs = key(res, "Values");
    if (!ts || !ts->is_array() || !vs || !vs->is_array())
      throw InputError(where + ": no Timestamps and Values arrays");
    MetricSeries s;
    s.label = !label.empty() ? label : id;
    const char* sample = nullptr;
    if (auto it = metric_of.find(id); it != metric_of.end()) sample = known_sample(it->second);
    if (!sample) sample = known_sample(label);
    if (!sample) sample = known_sample(id);
    s.known = sample != nullptr;
    s.sample = sample ? sample : "provider.cloudwatch." + (s.label.empty() ? "series" + std::to_string(r) : s.label);
    if (!s.known)
      d.notes.push_back("'" + s.label + "' is not a metric the models use: kept as sample " + s.sample);
    if (auto [it, fresh] = taken.try_emplace(s.sample, s.label); !fresh) {
      d.notes.push_back("'" + s.label + "' gives " + s.sample + " again (first from '" + it->second +
                        "'): left out");
      continue;
    }
    if (ts->size() != vs->size())
      d.notes.push_back("'" + s.label + "' has " + std::to_string(ts->size()) + " timestamps and " +
                        std::to_string(vs->size()) + " values: the first " +
                        std::to_string(std::min(ts->size(), vs->size())) + " pairs read");
    if (std::string status = text_of(key(res, "StatusCode")); !status.empty() && status != "Complete")
      d.notes.push_back("'" + s.label + "' has StatusCode " + status + ": its datapoints may be incomplete");
    size_t nulls = 0;
    for (size_t i = 0; i < std::min(ts->size(), vs->size()); ++i) {
      const auto& t = (*ts)[i];
      int64_t at = 0;
      if (!t.is_string() || !parse_iso8601(t.get<std::string>(), at))
        throw InputError(where + ".Timestamps[" + std::to_string(i) + "]: " + t.dump() + " is not an ISO 8601 time");
      const auto& v = (*vs)[i];
      if (v.is_null()) {
        ++nulls;
        continue;
      }
      if (!v.is_number())
        throw InputError(where + ".Values[" + std::to_string(i) + "]: " + v.dump() + " is not a number");
      s.points.push_back({at, v.get<double>()});
    }
    if (nulls) d.notes.push_back("'" + s.label + "': " + std::to_string(nulls) + " null values skipped");
    std::sort(s.points.begin(), s.points.end());
    for (size_t i = 1; i < s.points.size(); ++i) {
      double step = static_cast<double>(s.points[i].first - s.points[i - 1].first);
      if (step > 0 && (period_ns == 0 || step < period_ns)) period_ns = step;
    }
    if (s.points.empty()) d.notes.push_back("'" + s.label + "' has no datapoints");
    for (const auto& [at, v] : s.points) {
      if (!any_point || at < d.first_ns) d.first_ns = at;
      if (!any_point || at > d.last_ns) d.last_ns = at;
      any_point = true;
    }
    d.series.push_back(std::move(s));
  }
  d.period_s = period_ns / 1e9;
  // Gaps: a series with fewer datapoints than its span holds periods.
  if (period_ns > 0)
    for (const auto& s : d.series) {
      if (s.points.size() < 2) continue;
      const double span = static_cast<double>(s.points.back().first - s.points.front().first);
      const auto expect = static_cast<size_t>(std::llround(span / period_ns)) + 1;
      if (expect > s.points.size())
        d.notes.push_back("'" + s.label + "' misses " + std::to_string(expect - s.points.size()) + " of " +
                          std::to_string(expect) + " periods (gaps: no data then)");
    }
  if (!any_point) throw InputError(name + ": no datapoints in any of the " + std::to_string(results->size()) +
                                   " MetricDataResults");
  return d;
}

uint64_t write_cloudwatch(const CloudWatchData& d, trace::Writer& out, int64_t origin_ns) {
  uint64_t n = 0;
  auto meta = [&](const std::string& k, const std::string& v) {
    out.write(0, 0, trace::Meta{k, v});
    ++n;
  };
  meta("provider", "cloudwatch");
  if (d.period_s > 0) meta("provider.period_s", std::to_string(static_cast<int64_t>(std::llround(d.period_s))));
  if (d.vcpus > 0) meta("cpu.count", std::to_string(d.vcpus));
  if (d.memory_bytes > 0) meta("memory.bytes", std::to_string(static_cast<uint64_t>(d.memory_bytes)));
  struct Point {
    int64_t ts;
    const std::string* name;
    double v;
  };
  std::vector<Point> all;
  for (const auto& s : d.series)
    for (const auto& [at, v] : s.points) all.push_back({at - origin_ns, &s.sample, v});
  std::stable_sort(all.begin(), all.end(), [](const Point& a, const Point& b) { return a.ts < b.ts; });
  for (const auto& p : all) {
    out.write(p.ts, 0, trace::Sample{*p.name, p.v});
    ++n;
  }
  return n;
}

}  // namespace tierlab::capture
