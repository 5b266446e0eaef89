// The CloudWatch importer (capture/cloudwatch.h): input either parses or
// throws InputError; what it parses is written to a trace that reads back
// with one Sample per datapoint, in time order, every one within the
// data's span; and ISO 8601 times either parse or are refused.
#include "fuzz.h"

#include "capture/cloudwatch.h"
#include "trace/reader.h"

using namespace tierlab;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  int64_t ns = 0;
  (void)capture::parse_iso8601(text.substr(0, 64), ns);
  capture::CloudWatchData d;
  try {
    d = capture::parse_cloudwatch(text, "fuzz.json");
  } catch (const InputError&) {
    return 0;
  }
  for (const auto& s : d.series) {
    fuzz::check(!s.sample.empty(), "every series has a sample name", s.label);
    for (size_t i = 0; i < s.points.size(); ++i) {
      fuzz::check(s.points[i].first >= d.first_ns && s.points[i].first <= d.last_ns,
                  "every datapoint within the data's span", s.label);
      fuzz::check(i == 0 || s.points[i - 1].first <= s.points[i].first, "a series is oldest first", s.label);
    }
  }
  fuzz::check(d.period_s >= 0, "the period is not negative");

  auto sink = std::make_unique<trace::MemorySink>();
  auto* mem = sink.get();
  trace::WriterOptions wo;
  wo.start_mono_ns = 0;
  wo.realtime_offset_ns = d.first_ns;
  trace::Writer w(std::move(sink), wo);  // owns the sink: kept while it is read
  const uint64_t written = capture::write_cloudwatch(d, w, d.first_ns);
  w.close();
  trace::Reader r(trace::memory_source(mem->bytes(), "cloudwatch.tlt"));
  trace::Record rec;
  uint64_t records = 0, samples = 0;
  trace::Nanos last = INT64_MIN;
  while (r.next(rec)) {
    ++records;
    if (rec.kind() != trace::Kind::Sample) continue;
    ++samples;
    fuzz::check(rec.ts >= last, "samples in time order", fuzz::dump(rec));
    fuzz::check(rec.ts >= 0 && rec.ts <= d.last_ns - d.first_ns, "samples within the span", fuzz::dump(rec));
    last = rec.ts;
  }
  fuzz::check(records == written, "every record written reads back",
              std::to_string(records) + " vs " + std::to_string(written));
  fuzz::check(samples == d.datapoints(), "one Sample per datapoint",
              std::to_string(samples) + " vs " + std::to_string(d.datapoints()));
  return 0;
}
