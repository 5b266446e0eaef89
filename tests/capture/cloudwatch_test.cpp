// The reader of `aws cloudwatch get-metric-data` JSON (capture/cloudwatch.h).
#include "capture/cloudwatch.h"

#include "common/error.h"
#include "trace/reader.h"
#include "trace/writer.h"

#include <catch2/catch.hpp>

#include <fstream>
#include <map>
#include <sstream>

using namespace tierlab;
using Catch::Matchers::Contains;

namespace {

const capture::MetricSeries* find(const capture::CloudWatchData& d, const std::string& sample) {
  for (const auto& s : d.series)
    if (s.sample == sample) return &s;
  return nullptr;
}

bool noted(const capture::CloudWatchData& d, const std::string& part) {
  for (const auto& n : d.notes)
    if (n.find(part) != std::string::npos) return true;
  return false;
}

std::string message_of(const std::string& text) {
  try {
    capture::parse_cloudwatch(text, "m.json");
  } catch (const InputError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("cloudwatch: ISO 8601 times as the aws CLI prints them", "[capture][cloudwatch]") {
  int64_t ns = 0;
  REQUIRE(capture::parse_iso8601("2026-11-24T14:29:00+00:00", ns));
  CHECK(ns == 1795530540LL * 1'000'000'000);
  int64_t z = 0, off = 0, frac = 0;
  REQUIRE(capture::parse_iso8601("2026-11-24T14:29:00Z", z));
  REQUIRE(capture::parse_iso8601("2026-11-24T16:29:00+02:00", off));
  REQUIRE(capture::parse_iso8601("2026-11-24T14:29:00.250Z", frac));
  CHECK(z == ns);
  CHECK(off == ns);
  CHECK(frac == ns + 250'000'000);
  for (const char* bad : {"", "2026-11-24", "2026-13-24T14:29:00Z", "2026-11-24T14:29:00+0", "yesterday",
                          "2026-11-24T14:29:00Zjunk"}) {
    INFO(bad);
    CHECK_FALSE(capture::parse_iso8601(bad, ns));
  }
}

TEST_CASE("cloudwatch: a get-metric-data file, newest first, by Label or Id in any case", "[capture][cloudwatch]") {
  const std::string text = R"({
    "MetricDataResults": [
        {"Id": "m1", "Label": "ReadIOPS",
         "Timestamps": ["2026-11-24T14:02:00+00:00", "2026-11-24T14:01:00+00:00", "2026-11-24T14:00:00+00:00"],
         "Values": [3000.5, 2990.0, 2980.0], "StatusCode": "Complete"},
        {"Id": "write_iops", "Label": "",
         "Timestamps": ["2026-11-24T14:01:00+00:00", "2026-11-24T14:00:00+00:00"],
         "Values": [200, 210], "StatusCode": "Complete"},
        {"Id": "c", "Label": "cpuutilization",
         "Timestamps": ["2026-11-24T14:00:00+00:00"], "Values": [25.0], "StatusCode": "Complete"}
    ],
    "Messages": [],
    "Metadata": {"vcpus": 8, "memory": "64GiB"}
  })";
  auto d = capture::parse_cloudwatch(text, "m.json");
  REQUIRE(d.series.size() == 3);
  const auto* r = find(d, "provider.read_iops");
  REQUIRE(r);
  CHECK(r->known);
  REQUIRE(r->points.size() == 3);
  // Oldest first, whatever order the file gives.
  CHECK(r->points.front().second == 2980.0);
  CHECK(r->points.back().second == 3000.5);
  CHECK(find(d, "provider.write_iops"));
  CHECK(find(d, "provider.cpu_percent"));
  CHECK(d.period_s == 60);
  CHECK(d.vcpus == 8);
  CHECK(d.memory_bytes == 64.0 * (1ull << 30));
  CHECK(d.datapoints() == 6);
  CHECK(d.notes.empty());

  // Written as samples on a clock that starts at the first datapoint.
  auto sink = std::make_unique<trace::MemorySink>();
  auto* mem = sink.get();
  trace::WriterOptions wo;
  wo.start_mono_ns = 0;
  wo.realtime_offset_ns = d.first_ns;
  trace::Writer w(std::move(sink), wo);  // owns the sink: read before it goes
  capture::write_cloudwatch(d, w, d.first_ns);
  w.close();
  trace::Reader rd(trace::memory_source(mem->bytes()));
  CHECK(rd.header().realtime_offset_ns == d.first_ns);
  std::map<std::string, std::string> meta;
  std::vector<std::pair<int64_t, double>> reads;
  trace::Record rec;
  while (rd.next(rec)) {
    if (auto* m = std::get_if<trace::Meta>(&rec.body)) meta[std::string(m->key)] = std::string(m->value);
    if (auto* s = std::get_if<trace::Sample>(&rec.body); s && s->name == "provider.read_iops")
      reads.push_back({rec.ts, s->value});
  }
  CHECK(meta["provider"] == "cloudwatch");
  CHECK(meta["provider.period_s"] == "60");
  CHECK(meta["cpu.count"] == "8");
  CHECK(meta["memory.bytes"] == std::to_string(64ull << 30));
  REQUIRE(reads.size() == 3);
  CHECK(reads[0] == std::pair<int64_t, double>{0, 2980.0});
  CHECK(reads[2] == std::pair<int64_t, double>{120'000'000'000, 3000.5});
}

TEST_CASE("cloudwatch: MetricStat names of a MetricDataQueries block name the series", "[capture][cloudwatch]") {
  const std::string text = R"({
    "MetricDataQueries": [
      {"Id": "q1", "MetricStat": {"Metric": {"Namespace": "AWS/RDS", "MetricName": "WriteLatency",
        "Dimensions": [{"Name": "DBInstanceIdentifier", "Value": "db1"}]}, "Period": 60, "Stat": "Average"}}
    ],
    "MetricDataResults": [
      {"Id": "q1", "Label": "db1 latency", "Timestamps": ["2026-11-24T14:00:00Z"], "Values": [0.0012],
       "StatusCode": "Complete"}
    ]
  })";
  auto d = capture::parse_cloudwatch(text, "m.json");
  REQUIRE(d.series.size() == 1);
  CHECK(d.series[0].sample == "provider.write_latency_s");
  CHECK(d.series[0].label == "db1 latency");
}

TEST_CASE("cloudwatch: gaps, other names, uneven arrays and nulls are read as far as they go",
          "[capture][cloudwatch]") {
  const std::string text = R"({"MetricDataResults": [
      {"Id": "r", "Label": "ReadIOPS",
       "Timestamps": ["2026-11-24T14:05:00+00:00", "2026-11-24T14:04:00+00:00", "2026-11-24T14:01:00+00:00",
                      "2026-11-24T14:00:00+00:00"],
       "Values": [100, 101, 102, 103], "StatusCode": "Complete"},
      {"Id": "n", "Label": "NetworkReceiveThroughput", "Timestamps": ["2026-11-24T14:00:00+00:00"],
       "Values": [5.0], "StatusCode": "Complete"},
      {"Id": "w", "Label": "WriteIOPS", "Timestamps": ["2026-11-24T14:00:00+00:00", "2026-11-24T14:01:00+00:00"],
       "Values": [7], "StatusCode": "PartialData"},
      {"Id": "q", "Label": "DiskQueueDepth", "Timestamps": ["2026-11-24T14:00:00+00:00", "2026-11-24T14:01:00+00:00"],
       "Values": [null, 2.5], "StatusCode": "Complete"},
      {"Id": "e", "Label": "FreeableMemory", "Timestamps": [], "Values": [], "StatusCode": "Complete"}
  ]})";
  auto d = capture::parse_cloudwatch(text, "m.json");
  REQUIRE(find(d, "provider.read_iops"));
  CHECK(find(d, "provider.read_iops")->points.size() == 4);
  CHECK(noted(d, "'ReadIOPS' misses 2 of 6 periods"));
  const auto* other = find(d, "provider.cloudwatch.NetworkReceiveThroughput");
  REQUIRE(other);
  CHECK_FALSE(other->known);
  CHECK(noted(d, "'NetworkReceiveThroughput' is not a metric the models use"));
  REQUIRE(find(d, "provider.write_iops"));
  CHECK(find(d, "provider.write_iops")->points.size() == 1);
  CHECK(noted(d, "'WriteIOPS' has 2 timestamps and 1 values: the first 1 pairs read"));
  CHECK(noted(d, "'WriteIOPS' has StatusCode PartialData"));
  CHECK(find(d, "provider.queue_depth")->points.size() == 1);
  CHECK(noted(d, "'DiskQueueDepth': 1 null values skipped"));
  CHECK(noted(d, "'FreeableMemory' has no datapoints"));
  CHECK(d.vcpus == 0);
  CHECK(d.memory_bytes == 0);
}

TEST_CASE("cloudwatch: a wrong file is one line naming the file and where", "[capture][cloudwatch]") {
  CHECK_THAT(message_of("not json"), Contains("m.json: not JSON (at byte 2)"));
  CHECK_THAT(message_of(R"({"Datapoints": []})"),
             Contains("m.json: no MetricDataResults array: not the output of aws cloudwatch get-metric-data"));
  CHECK(message_of(R"({"MetricDataResults": [{"Id": "a", "Timestamps": ["2026-11-24T14:00:00Z"],
                      "Values": [1]}, {"Id": "b", "Values": [1]}]})") ==
        "m.json: MetricDataResults[1]: no Timestamps and Values arrays");
  CHECK(message_of(R"({"MetricDataResults": [{"Id": "a", "Timestamps": ["2026-11-24T14:00:00Z", "noon"],
                      "Values": [1, 2]}]})") ==
        "m.json: MetricDataResults[0].Timestamps[1]: \"noon\" is not an ISO 8601 time");
  CHECK(message_of(R"({"MetricDataResults": [{"Id": "a", "Timestamps": ["2026-11-24T14:00:00Z"],
                      "Values": ["x"]}]})") == "m.json: MetricDataResults[0].Values[0]: \"x\" is not a number");
  CHECK(message_of(R"({"MetricDataResults": []})") == "m.json: no datapoints in any of the 0 MetricDataResults");
  CHECK(message_of(R"({"MetricDataResults": [], "vcpus": "many"})") == "m.json: vcpus: \"many\" is not a count of CPUs");
  for (const char* text : {"not json", "{}", "[]"}) {
    INFO(text);
    std::string m = message_of(text);
    CHECK(m.find('\n') == std::string::npos);
    CHECK(!m.empty());
  }
}

TEST_CASE("cloudwatch: the example of tests/data, in the shape the aws CLI prints", "[capture][cloudwatch]") {
  std::ifstream in(std::string(TIERLAB_SOURCE_DIR) + "/tests/data/cloudwatch-rds-example.json");
  REQUIRE(in);
  std::stringstream ss;
  ss << in.rdbuf();
  auto d = capture::parse_cloudwatch(ss.str(), "example");
  CHECK(d.series.size() == 9);
  for (const auto& s : d.series) {
    INFO(s.label);
    CHECK(s.known);
    CHECK(s.points.size() == 15);
  }
  CHECK(d.period_s == 60);
  CHECK(d.notes.empty());
}
