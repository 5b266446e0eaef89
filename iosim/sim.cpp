#include "iosim/sim.h"

#include "common/error.h"
#include "trace/reader.h"

#include <algorithm>
#include <cstdio>
#include <cassert>
#include <cmath>
#include <cstring>

namespace tierlab::iosim {
namespace {

// A binary min-heap on `t` over an array sized up front. push() grows it
// (doubling) only when full; top/replace_top/pop never allocate.
template <typename T>
class MinHeap {
 public:
  explicit MinHeap(size_t capacity) { a_.resize(std::max<size_t>(capacity, 1)); }
  bool empty() const { return n_ == 0; }
  size_t size() const { return n_; }
  const T& top() const { return a_[0]; }
  void push(const T& v) {
    if (n_ == a_.size()) a_.resize(a_.size() * 2);
    size_t i = n_++;
    while (i > 0) {
      size_t p = (i - 1) / 2;
      if (!(v.t < a_[p].t)) break;
      a_[i] = a_[p];
      i = p;
    }
    a_[i] = v;
  }
  void replace_top(const T& v) {
    a_[0] = v;
    sift_down();
  }
  void pop() {
    if (--n_ > 0) {
      a_[0] = a_[n_];
      sift_down();
    }
  }

 private:
  // Bottom-up: walk the hole at the root down to a leaf along the smaller
  // children (one branch-free comparison per level), then sift the moved
  // value up from there. A value that belongs near the bottom -- a new
  // completion is usually the latest event -- costs one comparison per level
  // instead of two.
  void sift_down() {
    const T v = a_[0];
    size_t i = 0;
    for (;;) {
      size_t c = 2 * i + 1;
      if (c + 1 < n_) {
        c += a_[c + 1].t < a_[c].t;
      } else if (c >= n_) {
        break;
      }
      a_[i] = a_[c];
      i = c;
    }
    while (i > 0) {
      size_t p = (i - 1) / 2;
      if (!(v.t < a_[p].t)) break;
      a_[i] = a_[p];
      i = p;
    }
    a_[i] = v;
  }
  std::vector<T> a_;
  size_t n_ = 0;
};

// What the heap orders: when, and which I/O slot.
struct Entry {
  Nanos t = 0;
  uint32_t slot = 0;
  uint32_t issue_pending = 0;  // 1: the slot's stream issues at t (think time over)
};

// An I/O in flight; the heap refers to it by index (the index is the
// slot, as in fio's io_uring engine).
struct Event {
  Nanos t = 0;  // completion
  uint32_t counted = 0;
  IoRequest req;
  Nanos issue = 0;
  Nanos start = 0;
  Nanos recorded = 0;  // recorded completion (open loop), 0 = unknown
};

// Keeps the clock-dependent statistics: the queue-depth integral, its coarse
// time series, and the per-I/O results.
class Recorder {
 public:
  static constexpr int kBins = 64;

  Recorder(SimResult& r, const SimOptions& opt, Nanos initial_bin_width)
      : r_(r), opt_(opt), width_(std::max<Nanos>(initial_bin_width, 1)) {}

  void begin(Nanos t) {
    origin_ = last_ = t;
    r_.first_issue = t;
    started_ = true;
  }
  bool started() const { return started_; }

  // Moves the clock to t, integrating the queue depth.
  void advance(Nanos t) {
    if (t <= last_) return;
    if (qd_ > 0) {
      const double q = static_cast<double>(qd_);
      area_ += q * static_cast<double>(t - last_);
    }
    // Invariant: [origin_, origin_ + kBins * width_) covers t, after merging.
    while (t - origin_ >= kBins * width_) merge_bins();
    if (qd_ > 0) {
      const double q = static_cast<double>(qd_);
      Nanos a = last_;
      while (a < t) {
        int b = bin_of(a - origin_);
        Nanos end = std::min(t, origin_ + (b + 1) * width_);
        bins_[b] += q * static_cast<double>(end - a);
        a = end;
      }
    }
    last_ = t;
  }

  void issued() {
    ++qd_;
    if (qd_ > r_.max_queue_depth) r_.max_queue_depth = qd_;
  }

  // Call after advance(e.t).
  void completed(const Event& e) {
    --qd_;
    // Intervals are (t0, t0 + width] for completions, so the last one,
    // at the very end of the run, lands in the last interval.
    ++done_[e.t > origin_ ? bin_of(e.t - origin_ - 1) : 0];
    const Nanos lat = e.t - e.issue;
    OpResult& op = e.req.op == IoOp::Read    ? r_.read
                   : e.req.op == IoOp::Write ? r_.write
                                             : r_.other;
    ++op.ios;
    op.lat.record(lat);
    const uint64_t bytes =
        (e.req.op == IoOp::Read || e.req.op == IoOp::Write) ? e.req.length : 0;
    op.bytes += bytes;
    ++r_.ios;
    r_.bytes += bytes;
    if (e.t > r_.last_complete) r_.last_complete = e.t;
    if (e.recorded != 0) {
      const Nanos d = e.t - e.recorded;
      ++recorded_;
      behind_sum_ += static_cast<double>(d);
      if (d > 0) {
        ++r_.behind_ios;
        r_.behind.record(d);
      }
      if (e.recorded > last_recorded_) last_recorded_ = e.recorded;
    }
    if (opt_.observer) {
      IoEvent ev;
      ev.req = e.req;
      ev.issue = e.issue;
      ev.start = e.start;
      ev.complete = e.t;
      ev.counted = e.counted;
      opt_.observer(opt_.observer_ctx, ev);
    }
  }

  void finish(const Shaper& shaper, const std::string& tier) {
    r_.tier = tier;
    r_.shaper = shaper.stats();
    // The all-ops histogram is the sum of the per-op ones (one record() per
    // I/O instead of two).
    r_.lat.reset();
    r_.lat.merge(r_.read.lat);
    r_.lat.merge(r_.write.lat);
    r_.lat.merge(r_.other.lat);
    if (!started_) return;
    r_.elapsed_ns = r_.last_complete - r_.first_issue;
    if (r_.elapsed_ns > 0) {
      const double secs = static_cast<double>(r_.elapsed_ns) / 1e9;
      r_.iops = static_cast<double>(r_.ios) / secs;
      r_.bw_bytes = static_cast<double>(r_.bytes) / secs;
      r_.mean_queue_depth = area_ / static_cast<double>(r_.elapsed_ns);
    }
    r_.recorded_ios = recorded_;
    if (recorded_ > 0) {
      r_.mean_behind_ns = behind_sum_ / static_cast<double>(recorded_);
      r_.end_behind_ns = r_.last_complete - last_recorded_;
    }
    const Nanos span = r_.last_complete - origin_;
    r_.qd_series.reserve(kBins);
    for (int b = 0; b < kBins; ++b) {
      const Nanos t0 = static_cast<Nanos>(b) * width_;
      if (t0 >= span && b > 0) break;
      const Nanos w = std::min(width_, std::max<Nanos>(span - t0, 1));
      r_.qd_series.push_back({t0, w, bins_[b] / static_cast<double>(w), done_[b]});
    }
  }

 private:
  // The interval holding `rel` ns from the start; caches the last answer
  // (events come in time order) to keep a division off the common path.
  int bin_of(Nanos rel) {
    if (rel < bin_lo_ || rel >= bin_hi_) {
      bin_ = static_cast<int>(rel / width_);
      bin_lo_ = bin_ * width_;
      bin_hi_ = bin_lo_ + width_;
    }
    return bin_;
  }

  void merge_bins() {
    bin_lo_ = bin_hi_ = 0;  // forget the cached interval
    for (int i = 0; i < kBins / 2; ++i) {
      bins_[i] = bins_[2 * i] + bins_[2 * i + 1];
      done_[i] = done_[2 * i] + done_[2 * i + 1];
    }
    for (int i = kBins / 2; i < kBins; ++i) bins_[i] = 0, done_[i] = 0;
    width_ *= 2;
  }

  SimResult& r_;
  const SimOptions& opt_;
  bool started_ = false;
  Nanos origin_ = 0, last_ = 0, width_;
  uint64_t qd_ = 0;
  double area_ = 0;
  double bins_[kBins] = {};
  uint64_t done_[kBins] = {};
  int bin_ = 0;
  Nanos bin_lo_ = 0, bin_hi_ = 0;
  uint64_t recorded_ = 0;
  double behind_sum_ = 0;
  Nanos last_recorded_ = 0;
};

}  // namespace

// --- arrival sources -----------------------------------------------------------

PatternArrivals::PatternArrivals(const PatternSpec& pattern, double rate_iops, bool poisson,
                                 uint64_t count, Nanos runtime_ns)
    : pattern_(pattern),
      rng_(pattern.seed ^ 0x5ca1ab1e0ddba11ull),
      mean_gap_ns_(rate_iops > 0 ? 1e9 / rate_iops : 0),
      poisson_(poisson),
      count_(count),
      runtime_ns_(runtime_ns) {
  if (!(rate_iops > 0)) {
    char rate[32];
    std::snprintf(rate, sizeof rate, "%g", rate_iops);
    throw InputError(std::string("arrival rate ") + rate + " IOPS: must be above 0");
  }
  if (count == 0 && runtime_ns <= 0)
    throw InputError("an open loop needs a runtime or an I/O count to end");
}

bool PatternArrivals::next(Arrival& out) {
  if (count_ && issued_ >= count_) return false;
  const Nanos at = static_cast<Nanos>(std::llround(t_));
  if (runtime_ns_ > 0 && at >= runtime_ns_) return false;
  out.at = at;
  out.req = pattern_.next();
  out.recorded_complete = 0;
  ++issued_;
  t_ += poisson_ ? -mean_gap_ns_ * std::log(rng_.uniform()) : mean_gap_ns_;
  return true;
}

TraceArrivals::TraceArrivals(trace::Reader& reader, TraceRecords which, size_t reorder_window)
    : reader_(reader), which_(which), window_(std::max<size_t>(reorder_window, 1)) {
  heap_.reserve(window_);
}

// Reads records until one arrival is added to the window; false at the end.
bool TraceArrivals::fill_one() {
  trace::Record rec;
  while (!eof_) {
    if (!reader_.next(rec)) {
      eof_ = true;
      break;
    }
    Arrival a;
    if (const auto* b = std::get_if<trace::BlockIo>(&rec.body)) {
      ++block_;
      if (which_ == TraceRecords::File) continue;
      a.at = rec.ts;
      a.req = {b->op, b->offset, b->length};
      a.recorded_complete = (b->flags & trace::kIoIncomplete) ? 0 : b->complete_ns;
    } else if (const auto* f = std::get_if<trace::FileIo>(&rec.body)) {
      ++file_;
      if (which_ == TraceRecords::Block) continue;
      a.at = rec.ts;
      a.req = {f->op, f->offset, f->length};
      a.recorded_complete = f->latency_ns > 0 ? rec.ts + f->latency_ns : 0;
    } else {
      continue;
    }
    heap_.push_back(a);
    std::push_heap(heap_.begin(), heap_.end(), [](const Arrival& x, const Arrival& y) { return x.at > y.at; });
    return true;
  }
  return false;
}

bool TraceArrivals::next(Arrival& out) {
  while (heap_.size() < window_ && fill_one()) {
  }
  if (heap_.empty()) return false;
  std::pop_heap(heap_.begin(), heap_.end(), [](const Arrival& x, const Arrival& y) { return x.at > y.at; });
  out = heap_.back();
  heap_.pop_back();
  if (out.at < last_at_) {
    ++late_;
    out.at = last_at_;
  }
  last_at_ = out.at;
  return true;
}

// --- the simulations ---------------------------------------------------------------

SimResult simulate_closed(const tiers::Tier& tier, const ClosedLoop& loop, const SimOptions& opt) {
  if (loop.iodepth == 0) throw InputError("iodepth 0: must be at least 1");
  if (loop.runtime_ns <= 0 && loop.ios == 0)
    throw InputError("a closed loop needs a runtime or an I/O count to end");
  if (loop.think_ns < 0) throw InputError("think time " + std::to_string(loop.think_ns) + " ns: must not be negative");

  SimResult r;
  Shaper shaper(tier, opt.seed);
  Pattern pattern(loop.pattern);
  Recorder rec(r, opt, loop.runtime_ns > 0 ? (loop.runtime_ns + Recorder::kBins - 1) / Recorder::kBins
                                             : 1'000'000);
  MinHeap<Entry> heap(loop.iodepth);
  std::vector<Event> slots(loop.iodepth);

  uint64_t issued = 0;
  auto can_issue = [&](Nanos t) {
    return (loop.ios == 0 || issued < loop.ios) && (loop.runtime_ns <= 0 || t < loop.runtime_ns);
  };
  // Issues the stream's next I/O at t into its slot; returns its completion.
  auto issue = [&](uint32_t slot, Nanos t) {
    Event& e = slots[slot];
    e.req = pattern.next();
    const Schedule s = shaper.schedule(e.req, t);
    e.t = s.complete;
    e.counted = s.counted;
    e.issue = t;
    e.start = s.start;
    ++issued;
    rec.issued();
    return Entry{s.complete, slot, 0};
  };

  rec.begin(0);
  for (uint32_t i = 0; i < loop.iodepth && can_issue(0); ++i) heap.push(issue(i, 0));

  // Invariant: each of the iodepth streams has at most one entry in the
  // heap: its I/O's completion, or (during think time) its next issue.
  while (!heap.empty()) {
    const Entry top = heap.top();
    rec.advance(top.t);
    if (!top.issue_pending) {
      rec.completed(slots[top.slot]);
      const Nanos next = top.t + loop.think_ns;
      if (!can_issue(next)) {
        heap.pop();
      } else if (loop.think_ns == 0) {
        heap.replace_top(issue(top.slot, top.t));
      } else {
        heap.replace_top(Entry{next, top.slot, 1});
      }
    } else {
      heap.replace_top(issue(top.slot, top.t));
    }
  }
  rec.finish(shaper, tier.name);
  return r;
}

SimResult simulate_open(const tiers::Tier& tier, ArrivalSource& arrivals, const SimOptions& opt) {
  if (opt.open_iodepth == 0) throw InputError("iodepth 0: must be at least 1");
  SimResult r;
  r.open_loop = true;
  Shaper shaper(tier, opt.seed);
  Recorder rec(r, opt, 1'000'000);
  const size_t depth = opt.open_iodepth;
  MinHeap<Entry> heap(depth);
  std::vector<Event> slots(depth);
  std::vector<uint32_t> free_slots(depth);
  for (size_t i = 0; i < depth; ++i) free_slots[i] = static_cast<uint32_t>(depth - 1 - i);
  size_t nfree = depth;

  Arrival a;
  bool have = arrivals.next(a);
  bool waiting = false;    // `a` found every slot taken
  bool prev_late = false;  // the last issue was later than kLateIssueNs
  Nanos freed_at = INT64_MIN;  // time of the last completion
  if (have) rec.begin(a.at);
  const Nanos cutoff = have && opt.open_runtime_ns > 0 ? a.at + opt.open_runtime_ns : INT64_MAX;
  // Invariant: every slot is free or has exactly one entry in the heap.
  while (have || !heap.empty()) {
    assert(nfree + heap.size() == depth);
    // The next arrival goes at its time, or when a slot frees if it had to
    // wait. A completion at the same instant is processed first.
    const Nanos t = have ? std::max(a.at, freed_at) : 0;
    if (have && t >= cutoff) {
      have = false;  // the run's time is over: issue nothing more
      continue;
    }
    if (have && nfree > 0 && (heap.empty() || t < heap.top().t)) {
      rec.advance(t);
      const uint32_t slot = free_slots[--nfree];
      Event& e = slots[slot];
      e.req = a.req;
      const Schedule s = shaper.schedule(a.req, t);
      e.t = s.complete;
      e.counted = s.counted;
      e.issue = t;
      e.start = s.start;
      e.recorded = a.recorded_complete;
      rec.issued();
      heap.push(Entry{s.complete, slot, 0});
      const Nanos lag = t - a.at;
      r.issue_lag.record(lag);
      const bool late = lag > SimResult::kLateIssueNs;
      if (late) {
        ++r.late_issues;
        if (!prev_late) ++r.issue_stalls;
      }
      prev_late = late;
      waiting = false;
      have = arrivals.next(a);
    } else {
      if (have && nfree == 0 && !waiting && a.at < heap.top().t) {
        // Due before any slot frees: it waits (counted once).
        ++r.slot_waits;
        waiting = true;
      }
      const Entry top = heap.top();
      rec.advance(top.t);
      rec.completed(slots[top.slot]);
      free_slots[nfree++] = top.slot;
      freed_at = top.t;
      heap.pop();
    }
  }
  rec.finish(shaper, tier.name);
  if (auto* t = dynamic_cast<TraceArrivals*>(&arrivals)) r.late_arrivals = t->late();
  return r;
}

}  // namespace tierlab::iosim
