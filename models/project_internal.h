// The projection's parts apart from the network (models/project.cpp).
// Private to models/.
#pragma once

#include "models/project.h"

namespace tierlab::models {

// E[L^2] of a tier's latency distribution, seconds squared.
double second_moment(const Latency& l);

// 99th percentile of a gamma distribution with this mean and variance
// (bisection on the regularised incomplete gamma function).
double gamma_p99(double mean, double var);

// Sets the Projection's capture_tier* fields, capture_capped and
// queued_s_per_tx (see project.h) from the options' tier or cap, else the
// profile's detection, with notes where the queue times cannot say what
// they should. Returns the capture's tier: its rate caps only.
Tier capture_tier(const Profile& p, const ProjectOptions& o, Projection& out);

}  // namespace tierlab::models
