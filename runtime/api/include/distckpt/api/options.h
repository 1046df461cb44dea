// Options of save and load, by job: distckpt/save/options.h (SaveOptions)
// and distckpt/load/options.h (LoadOptions).
#pragma once

#include "distckpt/load/options.h"
#include "distckpt/save/options.h"
