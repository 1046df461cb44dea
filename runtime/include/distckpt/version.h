// The version of the distckpt runtime, for code that must match it: the C++
// that distckpt-gen generates checks it at compile time. (Placeholder with
// the project version, 0.1.0; the runtime provides the definitive header.)
#pragma once

#define DISTCKPT_VERSION_MAJOR 0
#define DISTCKPT_VERSION_MINOR 1
#define DISTCKPT_VERSION_PATCH 0
