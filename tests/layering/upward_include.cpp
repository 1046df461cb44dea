// Compiled against the plan layer only: the api layer sits above it, so its
// headers must not be found. The test that builds this expects that error.
#include "distckpt/api/options.h"
