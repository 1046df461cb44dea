// Compiled against the storage layer only: the save pipeline sits above it
// (it drives the storage writers), so its headers must not be found.
#include "save/save_plan.h"
