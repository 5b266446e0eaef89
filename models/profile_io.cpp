// Profiling a trace file (kept apart from the builder so that code using only
// ProfileBuilder does not pull in the trace reader).
#include "models/profile.h"
#include "trace/reader.h"

namespace tierlab::models {

Profile profile_trace(trace::Reader& reader, const std::string& source, ProfileOptions opts) {
  ProfileBuilder b(opts);
  trace::Record r;
  while (reader.next(r)) b.add(r);
  return b.finish(source);
}

Profile profile_file(const std::string& path, ProfileOptions opts) {
  auto reader = trace::open_reader(path);
  return profile_trace(*reader, path, opts);
}

}  // namespace tierlab::models
