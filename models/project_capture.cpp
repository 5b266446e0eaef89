// The capture's own tier: which caps it ran under, whether it ran at one,
// and what that means for its queue times before issue.
#include "models/fmt.h"
#include "models/project_internal.h"

namespace tierlab::models {

Tier capture_tier(const Profile& p, const ProjectOptions& o, Projection& out) {
  Tier caps;  // only its rate caps count
  if (o.captured_tier) {
    caps = *o.captured_tier;
    out.capture_tier_source = "known";
    out.capture_tier = caps.name;
  } else if (o.captured_iops_cap > 0) {
    caps.total_iops = o.captured_iops_cap;
    out.capture_tier_source = "known";
    out.capture_tier = fmt("%.0f IOPS", o.captured_iops_cap);
  } else if (p.cap_bound) {
    (p.cap_op == "write" ? caps.write_iops : p.cap_op == "total" ? caps.total_iops : caps.read_iops) = p.cap_iops;
    out.capture_tier_source = "detected";
    out.capture_tier = p.cap_op + " IOPS cap ~" + fmt("%.0f", p.cap_iops);
  } else {
    out.capture_tier_source = "assumed uncapped";
  }
  double total_cap = caps.total_iops;
  if (caps.burst.enabled()) total_cap = total_cap > 0 ? std::min(total_cap, caps.burst.refill_iops) : caps.burst.refill_iops;
  // The rates the capture ran at against the caps (10% short of one is
  // taken as at it: a token bucket's rate is not reached exactly).
  const double rd = p.device_read_iops;
  const double wr = p.device_write_iops + (caps.count_flushes ? p.flushes_per_tx * p.tps : 0);
  struct {
    double rate, cap;
  } at[] = {{rd, caps.read_iops}, {wr, caps.write_iops}, {rd + wr, total_cap}};
  bool any = false;
  double rate = 0, cap = 0;
  for (const auto& a : at)
    if (a.cap > 0) {
      any = true;
      if (o.capture_at_cap >= 0) out.capture_capped = o.capture_at_cap > 0;
      else if (a.rate >= 0.9 * a.cap) out.capture_capped = true;
      if (rate == 0 || a.rate / a.cap > rate / cap) {
        rate = a.rate;
        cap = a.cap;
      }
    }
  out.queued_s_per_tx = p.has_queue_times ? p.queued_s_per_tx : 0.0;
  if (any && !out.capture_capped && p.has_block_io)
    out.notes.push_back("the capture ran at " + fmt("%.0f", rate) + " IOPS, below its tier's cap of " +
                        fmt("%.0f", cap) + ": the cap did not bind, and the queue time before issue is kept "
                        "on every tier");
  // At a cap the requests wait for it: queue times shorter than the
  // device's own service did not see that wait (cgroup throttling of a
  // whole disk holds bios before the block layer traces them).
  const bool short_queues =
      p.has_queue_times && (p.queued_read.count == 0 || p.queued_read.mean_s < p.native_read.mean_s) &&
      (p.queued_write.count == 0 || p.queued_write.mean_s < p.native_write.mean_s);
  if (out.capture_capped && short_queues)
    out.notes.push_back("the capture ran at its tier's cap (" + out.capture_tier +
                        ") but its requests waited before issue less than the device served them: the queue "
                        "times did not see the wait for the cap (cgroup throttling of a whole disk; capture on "
                        "a partition), which is in 'other', so a tier without the cap is projected with no gain "
                        "from losing it (a lower bound)");
  if (out.capture_capped && !p.has_queue_times && !p.latency_holds_cap_wait)
    out.notes.push_back("the capture ran at its tier's cap (" + out.capture_tier +
                        ") but the trace has no queue times before issue (trace format 1.2, capture block "
                        "with block_bio_queue): the wait for the cap is in 'other', so a tier without the "
                        "cap is projected with no gain from losing it (a lower bound)");
  return caps;
}

}  // namespace tierlab::models
