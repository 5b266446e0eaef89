// Group commit: how many commits share one WAL flush (private to models/).
//
// A committing backend writes the WAL up to its commit record and flushes
// it (fdatasync). While one flush cycle is in progress the backends that
// commit meanwhile wait for it, and the next cycle writes and flushes the
// WAL of all of them at once (PostgreSQL's XLogFlush under WALWriteLock).
// With commits arriving at rate X and cycles of duration F, a cycle that
// starts right after another carries the commits that arrived during it
// (X F on average); a cycle that finds none waiting starts with the next
// commit alone. With Poisson arrivals the mean batch is
//
//   b(X, F) = X F + exp(-X F)        (never more than the n clients)
//
// so flushes per transaction are 1 / b: one per commit at low load, falling
// towards 1/n as the cycle lengthens. A commit waits for the rest of the
// cycle in progress (F/2 on average, while cycles run back to back, which
// they do a fraction rho = (X / b) F of the time) and for its own cycle:
//
//   R(X) = F (1 + rho / 2)
//
// (rho counted at n - 1 clients, as the arrival theorem has it: a lone
// client never waits for another's cycle).
//
// The cycle's duration on a tier without caps, D, is calibrated on the
// capture: the cycle F_c for which b(X_c, F_c) gives the commits per flush
// measured at the captured throughput X_c (1 / flushes per transaction),
// scaled on another tier by its device time for one cycle (its WAL writes
// then its flush) over the captured device's. A measured batch of one or
// less (more flushes than commits: the WAL writer's, the file system
// journal's) keeps the extra flushes as `flushes` per cycle and a cycle
// of no length.
//
// On a tier whose rate caps count the cycle's I/Os, cycles that run back
// to back cannot come faster than the tokens the cap leaves them, P =
// tokens per cycle / (limit - what the rest of the workload takes at
// throughput X); a cycle that starts after an idle spell finds tokens
// banked and takes D. A cycle follows another when a commit arrived during
// it, with probability 1 - exp(-X F), so
//
//   F = exp(-X F) D + (1 - exp(-X F)) max(D, P)
//
// (solved for F between D and max(D, P)): under a tight cap F grows towards
// P and more commits share a flush.
#pragma once

#include <vector>

namespace tierlab::models {

// Mean commits per flush cycle at commit rate x (per second) and cycle
// duration f (seconds), with at most n clients: x f + exp(-x f), in [1, n].
double group_commit_batch(double x, double f, int n);

// Writes per second of the server's auxiliary processes (the background
// writer cleaning buffers ahead of the backends, the checkpointer) at
// throughput x. They write what the transactions dirty, `per_tx` each, up
// to `max_per_s`, the most they wrote at capture (the background writer is
// paced: at most bgwriter_lru_maxpages per bgwriter_delay); beyond that
// the backends' own evictions are left to the kernel's writeback. per_tx 0:
// max_per_s whatever the throughput.
inline double server_writes_at(double max_per_s, double per_tx, double x) {
  if (!(per_tx > 0)) return max_per_s;
  double w = per_tx * (x > 0 ? x : 0);
  return w < max_per_s ? w : max_per_s;
}

struct FlushCycle {
  // Fraction of transactions that commit through the cycle (those that
  // wrote WAL; read-only ones commit without a flush): commits arrive at
  // share x, and the per-transaction figures below average over all.
  double share = 1;
  double flushes = 1;           // flushes per cycle
  double writes = 0;            // WAL writes per cycle
  double captured_s = 0;        // the cycle at capture (calibrated, F_c)
  double captured_device_s = 0; // the captured device's writes + flush for one cycle
  double device_s = 0;          // D on the tier in use (see set_device)
  // A rate cap that counts the cycle's I/Os: the cycle takes `tokens` of
  // `limit` per second, the rest of the workload x per_tx plus the server's
  // own writes, server_writes_at(fixed_per_s, fixed_per_tx, x).
  struct Pace {
    double tokens = 0;
    double limit = 0;
    double fixed_per_s = 0;
    double per_tx = 0;
    double fixed_per_tx = 0;
  };
  std::vector<Pace> paces;

  // Duration of one cycle at throughput x (see the file comment). When the
  // rest of the workload alone asks for more than a cap, the cap is shared
  // in proportion to demand, the cycles asking for one cycle per device
  // time; +infinity only if the device time is 0 then.
  double cycle_s(double x) const;
  // Commits per flush at throughput x (transactions per second).
  double batch(double x, int n) const { return group_commit_batch(share * x, cycle_s(x), n); }
  double flushes_per_tx(double x, int n) const { return share * flushes / batch(x, n); }
  double writes_per_tx(double x, int n) const { return share * writes / batch(x, n); }
  // Fraction of the time a cycle is in progress.
  double busy(double x, int n) const;
  // Time in the cycle per transaction: for a committing one the rest of the
  // cycle in progress and its own, times `share`.
  double residence_s(double x, int n) const;
};

// Builds the cycle from what the capture measured: flushes and WAL writes
// per transaction (flushes_per_tx > 0) at throughput x_c with n_c clients,
// `share` (in (0, 1]) of the transactions committing through it, on a
// device with mean write latency lw and flush latency lf (seconds).
// device_s is set for the captured device.
FlushCycle calibrate_flush_cycle(double flushes_per_tx, double writes_per_tx, double x_c, int n_c,
                                 double lw, double lf, double share = 1);

// Sets device_s for a tier with mean write latency lw and flush latency lf:
// the captured cycle scaled by this tier's writes + flush over the captured
// device's (the captured cycle itself when the capture has no latencies).
void set_device(FlushCycle& c, double lw, double lf);

}  // namespace tierlab::models
