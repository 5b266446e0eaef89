#include "tiers/tiers.h"

#include "common/error.h"

#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <initializer_list>
#include <sstream>
#include <vector>

namespace tierlab::tiers {
namespace {

using json = nlohmann::json;
using ojson = nlohmann::ordered_json;  // output keeps the documented key order

constexpr double kMiB = 1024.0 * 1024.0;
constexpr Nanos kUs = 1000;

Latency lognormal(Nanos p50, Nanos p99) { return {LatencyDist::Lognormal, p50, p99}; }

// Figures and sources: docs/tiers.md. Keep the two in step.
std::vector<Tier> builtin_tiers() {
  std::vector<Tier> v;
  {
    Tier t;
    t.name = "nvme-local";
    t.description = "local NVMe SSD (instance store): no IOPS cap, ~85 us reads, 64 I/Os in parallel";
    t.bytes_per_sec = 3000 * kMiB;
    t.read = lognormal(85 * kUs, 250 * kUs);
    t.write = lognormal(25 * kUs, 100 * kUs);
    t.flush = lognormal(50 * kUs, 200 * kUs);
    t.parallelism = 64;
    v.push_back(t);
  }
  Tier ebs;
  ebs.io_unit_bytes = 256 * 1024;
  ebs.merge_sequential = true;
  ebs.read = lognormal(600 * kUs, 2500 * kUs);
  ebs.write = lognormal(800 * kUs, 3000 * kUs);
  ebs.flush = lognormal(600 * kUs, 2500 * kUs);
  ebs.parallelism = 64;
  {
    Tier t = ebs;
    t.name = "ebs-gp3";
    t.description = "EBS gp3 at its baseline: 3,000 IOPS, 125 MiB/s";
    t.total_iops = 3000;
    t.bytes_per_sec = 125 * kMiB;
    v.push_back(t);
  }
  {
    Tier t = ebs;
    t.name = "ebs-gp3-16k";
    t.description = "EBS gp3 provisioned to its maximum: 16,000 IOPS, 1,000 MiB/s";
    t.total_iops = 16000;
    t.bytes_per_sec = 1000 * kMiB;
    v.push_back(t);
  }
  {
    Tier t = ebs;
    t.name = "ebs-gp2-100g";
    t.description = "EBS gp2, 100 GiB: 300 IOPS baseline, bursts to 3,000 IOPS on 5.4 M credits";
    t.bytes_per_sec = 128 * kMiB;
    t.burst = Burst{5.4e6, 3000, 300};
    v.push_back(t);
  }
  {
    Tier t = ebs;
    t.name = "ebs-io2-bx";
    t.description = "EBS io2 Block Express, 64,000 provisioned IOPS, 4,000 MiB/s, sub-ms latency";
    t.total_iops = 64000;
    t.bytes_per_sec = 4000 * kMiB;
    t.read = lognormal(300 * kUs, 800 * kUs);
    t.write = lognormal(350 * kUs, 900 * kUs);
    t.flush = lognormal(300 * kUs, 800 * kUs);
    t.parallelism = 256;
    v.push_back(t);
  }
  {
    Tier t = ebs;
    t.name = "rds-16k";
    t.description = "RDS Provisioned IOPS SSD (io2) storage at 16,000 IOPS";
    t.total_iops = 16000;
    t.bytes_per_sec = 4000 * kMiB;
    t.read = lognormal(400 * kUs, 1000 * kUs);
    t.write = lognormal(500 * kUs, 1200 * kUs);
    t.flush = lognormal(400 * kUs, 1000 * kUs);
    t.parallelism = 128;
    v.push_back(t);
  }
  {
    Tier t;
    t.name = "aurora-io-optimized";
    t.description =
        "Aurora I/O-Optimized storage: no per-volume IOPS cap; network reads, "
        "writes wait for 4 of 6 copies in 3 AZs";
    t.read = lognormal(700 * kUs, 2500 * kUs);
    t.write = lognormal(1200 * kUs, 4000 * kUs);
    t.flush = lognormal(1200 * kUs, 4000 * kUs);
    t.parallelism = 256;
    v.push_back(t);
  }
  return v;
}

// --- JSON reading --------------------------------------------------------------

// Walks a JSON document keeping the path for messages.
struct Ctx {
  const std::string& file;
  std::string path;

  [[noreturn]] void fail(const std::string& what) const {
    throw InputError(file + ": " + path + ": " + what);
  }
  Ctx at(const std::string& key) const { return Ctx{file, path.empty() ? key : path + "." + key}; }
  Ctx at(size_t i) const { return Ctx{file, path + "[" + std::to_string(i) + "]"}; }
};

double get_number(const json& j, const Ctx& c, double min, double max) {
  if (!j.is_number()) c.fail("expected a number");
  double v = j.get<double>();
  if (!std::isfinite(v) || v < min || v > max) {
    std::ostringstream os;
    os << "value " << v << " out of range [" << min << ", " << max << "]";
    c.fail(os.str());
  }
  return v;
}

std::string get_string(const json& j, const Ctx& c) {
  if (!j.is_string()) c.fail("expected a string");
  return j.get<std::string>();
}

bool get_bool(const json& j, const Ctx& c) {
  if (!j.is_boolean()) c.fail("expected true or false");
  return j.get<bool>();
}

void check_keys(const json& j, const Ctx& c, std::initializer_list<const char*> known) {
  if (!j.is_object()) c.fail("expected an object");
  for (auto it = j.begin(); it != j.end(); ++it) {
    bool ok = false;
    for (const char* k : known) ok = ok || it.key() == k;
    if (!ok) {
      std::string list;
      for (const char* k : known) list += std::string(list.empty() ? "" : ", ") + k;
      c.at(it.key()).fail("unknown key (known: " + list + ")");
    }
  }
}

constexpr double kBig = 1e15;

Nanos us_to_ns(double us) { return static_cast<Nanos>(std::llround(us * 1000.0)); }

void read_latency(const json& j, const Ctx& c, Latency& l) {
  check_keys(j, c, {"dist", "p50_us", "p99_us"});
  if (j.contains("dist")) {
    auto s = get_string(j["dist"], c.at("dist"));
    if (s == "fixed") l.dist = LatencyDist::Fixed;
    else if (s == "lognormal") l.dist = LatencyDist::Lognormal;
    else if (s == "exponential") l.dist = LatencyDist::Exponential;
    else c.at("dist").fail("unknown distribution \"" + s + "\" (known: fixed, lognormal, exponential)");
  }
  if (j.contains("p50_us")) l.p50_ns = us_to_ns(get_number(j["p50_us"], c.at("p50_us"), 0, 1e9));
  if (j.contains("p99_us")) l.p99_ns = us_to_ns(get_number(j["p99_us"], c.at("p99_us"), 0, 1e9));
  if (l.dist != LatencyDist::Lognormal) l.p99_ns = 0;
}

Tier read_tier(const json& j, const Ctx& c, const Catalog& known) {
  if (!j.is_object()) c.fail("expected an object");
  // Every message about the tier names it ("tiers[1] (gp3-6k).iopz"), once
  // it has a usable name.
  Ctx tc = c;
  if (auto it = j.find("name"); it != j.end() && it->is_string() && !it->get_ref<const std::string&>().empty())
    tc.path += " (" + it->get<std::string>() + ")";
  check_keys(j, tc,
             {"name", "base", "description", "iops", "read_iops", "write_iops", "throughput_mib_s",
              "bucket_ms", "io_unit_kib", "merge_sequential", "count_flushes", "parallelism", "latency",
              "burst"});
  if (!j.contains("name")) c.fail("missing key \"name\"");
  Tier t;
  if (j.contains("base")) {
    auto base = get_string(j["base"], tc.at("base"));
    const Tier* b = known.find(base);
    if (!b) tc.at("base").fail("unknown tier \"" + base + "\" (known: " + known.names() + ")");
    t = *b;
    t.description.clear();
  }
  t.name = get_string(j["name"], c.at("name"));
  if (t.name.empty()) c.at("name").fail("empty name");
  if (j.contains("description")) t.description = get_string(j["description"], tc.at("description"));
  if (j.contains("iops")) t.total_iops = get_number(j["iops"], tc.at("iops"), 0, kBig);
  if (j.contains("read_iops")) t.read_iops = get_number(j["read_iops"], tc.at("read_iops"), 0, kBig);
  if (j.contains("write_iops")) t.write_iops = get_number(j["write_iops"], tc.at("write_iops"), 0, kBig);
  if (j.contains("throughput_mib_s"))
    t.bytes_per_sec = get_number(j["throughput_mib_s"], tc.at("throughput_mib_s"), 0, kBig) * kMiB;
  if (j.contains("bucket_ms"))
    t.bucket_ns = static_cast<Nanos>(std::llround(get_number(j["bucket_ms"], tc.at("bucket_ms"), 0, 1e9) * 1e6));
  if (j.contains("io_unit_kib"))
    t.io_unit_bytes = static_cast<uint64_t>(get_number(j["io_unit_kib"], tc.at("io_unit_kib"), 0, 1 << 30)) * 1024;
  if (j.contains("merge_sequential")) t.merge_sequential = get_bool(j["merge_sequential"], tc.at("merge_sequential"));
  if (j.contains("count_flushes")) t.count_flushes = get_bool(j["count_flushes"], tc.at("count_flushes"));
  if (j.contains("parallelism"))
    t.parallelism = static_cast<uint32_t>(get_number(j["parallelism"], tc.at("parallelism"), 0, 1 << 20));
  if (j.contains("latency")) {
    const auto& l = j["latency"];
    Ctx lc = tc.at("latency");
    check_keys(l, lc, {"read", "write", "flush"});
    if (l.contains("read")) read_latency(l["read"], lc.at("read"), t.read);
    if (l.contains("write")) read_latency(l["write"], lc.at("write"), t.write);
    if (l.contains("flush")) read_latency(l["flush"], lc.at("flush"), t.flush);
  }
  if (j.contains("burst")) {
    const auto& b = j["burst"];
    Ctx bc = tc.at("burst");
    check_keys(b, bc, {"credits", "burst_iops", "refill_iops"});
    if (b.contains("credits")) t.burst.credits = get_number(b["credits"], bc.at("credits"), 0, kBig);
    if (b.contains("burst_iops")) t.burst.burst_iops = get_number(b["burst_iops"], bc.at("burst_iops"), 0, kBig);
    if (b.contains("refill_iops")) t.burst.refill_iops = get_number(b["refill_iops"], bc.at("refill_iops"), 0, kBig);
  }
  validate(t, c.file + ": " + tc.path);
  return t;
}

ojson latency_json(const Latency& l) {
  ojson j;
  j["dist"] = std::string(dist_name(l.dist));
  j["p50_us"] = static_cast<double>(l.p50_ns) / 1000.0;
  if (l.dist == LatencyDist::Lognormal) j["p99_us"] = static_cast<double>(l.p99_ns) / 1000.0;
  return j;
}

}  // namespace

std::string_view dist_name(LatencyDist d) {
  switch (d) {
    case LatencyDist::Fixed: return "fixed";
    case LatencyDist::Lognormal: return "lognormal";
    case LatencyDist::Exponential: return "exponential";
  }
  return "?";
}

void validate(const Tier& t, const std::string& where) {
  auto bad = [&](const std::string& field, const std::string& what) {
    throw InputError(where + ": " + field + ": " + what);
  };
  auto check_lat = [&](const Latency& l, const char* op) {
    if (l.p50_ns < 0) bad(std::string("latency.") + op + ".p50_us", "must not be negative");
    if (l.dist == LatencyDist::Lognormal && l.p50_ns <= 0)
      bad(std::string("latency.") + op + ".p50_us", "a lognormal latency needs p50_us > 0");
    if (l.dist == LatencyDist::Lognormal && l.p99_ns <= l.p50_ns)
      bad(std::string("latency.") + op + ".p99_us", "a lognormal latency needs p99_us > p50_us");
  };
  check_lat(t.read, "read");
  check_lat(t.write, "write");
  check_lat(t.flush, "flush");
  if (t.read_iops < 0 || t.write_iops < 0 || t.total_iops < 0) bad("iops", "must not be negative");
  if (t.bytes_per_sec < 0) bad("throughput_mib_s", "must not be negative");
  if (t.bucket_ns < 0) bad("bucket_ms", "must not be negative");
  if (t.burst.enabled()) {
    if (t.burst.burst_iops <= 0) bad("burst.burst_iops", "a burst bucket needs burst_iops > 0");
    if (t.burst.refill_iops <= 0) bad("burst.refill_iops", "a burst bucket needs refill_iops > 0");
  }
}

std::string to_json(const Tier& t) {
  ojson j;
  j["name"] = t.name;
  j["description"] = t.description;
  j["iops"] = t.total_iops;
  j["read_iops"] = t.read_iops;
  j["write_iops"] = t.write_iops;
  j["throughput_mib_s"] = t.bytes_per_sec / kMiB;
  j["bucket_ms"] = static_cast<double>(t.bucket_ns) / 1e6;
  j["io_unit_kib"] = t.io_unit_bytes / 1024;
  j["merge_sequential"] = t.merge_sequential;
  j["count_flushes"] = t.count_flushes;
  j["parallelism"] = t.parallelism;
  j["latency"] = {{"read", latency_json(t.read)},
                  {"write", latency_json(t.write)},
                  {"flush", latency_json(t.flush)}};
  if (t.burst.enabled())
    j["burst"] = {{"credits", t.burst.credits},
                  {"burst_iops", t.burst.burst_iops},
                  {"refill_iops", t.burst.refill_iops}};
  return j.dump(2);
}

Catalog Catalog::builtin() {
  Catalog c;
  c.tiers_ = builtin_tiers();
  return c;
}

void Catalog::load_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw InputError(path + ": " + errno_message("cannot open tiers file", errno));
  std::stringstream ss;
  ss << in.rdbuf();
  load_json(ss.str(), path);
}

void Catalog::load_json(std::string_view text, const std::string& name) {
  // Where the parser is, as the messages below spell a path ("tiers[1].iops"):
  // a number too large for a double ("1e400") parses as JSON but stops the
  // parser with no position of its own.
  struct Frame {
    bool array = false;
    size_t index = 0;
    std::string key;
  };
  std::vector<Frame> at;
  auto where = [&] {
    std::string path;
    for (const auto& f : at)
      path += f.array ? "[" + std::to_string(f.index) + "]" : (path.empty() ? "" : ".") + f.key;
    return path.empty() ? std::string("top level") : path;
  };
  json::parser_callback_t track = [&](int, json::parse_event_t ev, json& parsed) {
    switch (ev) {
      case json::parse_event_t::object_start: at.push_back({false, 0, ""}); break;
      case json::parse_event_t::array_start: at.push_back({true, 0, ""}); break;
      case json::parse_event_t::key: at.back().key = parsed.get<std::string>(); break;
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        at.pop_back();
        [[fallthrough]];
      case json::parse_event_t::value:
        if (!at.empty() && at.back().array) ++at.back().index;
        break;
    }
    return true;
  };
  json doc;
  try {
    doc = json::parse(text, track);
  } catch (const json::parse_error& e) {
    throw InputError(name + ": not valid JSON: " + e.what());
  } catch (const json::out_of_range& e) {
    // "[json.exception.out_of_range.406] number overflow parsing '1e400'"
    std::string what = e.what();
    auto q = what.find('\'');
    std::string number = q == std::string::npos ? std::string() : what.substr(q + 1, what.rfind('\'') - q - 1);
    throw InputError(name + ": " + where() + ": number " + number + " is out of range");
  } catch (const json::exception& e) {
    throw InputError(name + ": not valid JSON: " + e.what());
  }
  // Three shapes: {"tiers": [...]}, [...], or one tier object (what
  // `tiers show --json` prints).
  Ctx root{name, ""};
  const json* list = nullptr;
  std::string prefix;
  if (doc.is_object() && doc.contains("tiers")) {
    check_keys(doc, Ctx{name, "top level"}, {"tiers"});
    list = &doc["tiers"];
    prefix = "tiers";
    if (!list->is_array()) Ctx{name, "tiers"}.fail("expected an array of tiers");
  } else if (doc.is_array()) {
    list = &doc;
    prefix = "";
  } else if (doc.is_object()) {
    Tier t = read_tier(doc, Ctx{name, "tier"}, *this);
    bool replaced = false;
    for (auto& old : tiers_)
      if (old.name == t.name) old = t, replaced = true;
    if (!replaced) tiers_.push_back(t);
    return;
  } else {
    root.path = "top level";
    root.fail("expected an object with \"tiers\": [...]");
  }
  for (size_t i = 0; i < list->size(); ++i) {
    Tier t = read_tier((*list)[i], Ctx{name, prefix}.at(i), *this);
    bool replaced = false;
    for (auto& old : tiers_)
      if (old.name == t.name) old = t, replaced = true;
    if (!replaced) tiers_.push_back(t);
  }
}

const Tier* Catalog::find(std::string_view name) const {
  for (const auto& t : tiers_)
    if (t.name == name) return &t;
  return nullptr;
}

const Tier& Catalog::get(std::string_view name) const {
  if (const Tier* t = find(name)) return *t;
  throw InputError("unknown tier \"" + std::string(name) + "\" (known: " + names() + ")");
}

std::string Catalog::names() const {
  std::string s;
  for (const auto& t : tiers_) s += (s.empty() ? "" : ", ") + t.name;
  return s;
}

Catalog load_catalog(const std::string& tiers_file) {
  Catalog c = Catalog::builtin();
  if (!tiers_file.empty()) c.load_file(tiers_file);
  return c;
}

}  // namespace tierlab::tiers
