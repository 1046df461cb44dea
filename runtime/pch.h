// Precompiled header: the heavy, stable headers every runtime source uses.
#pragma once
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>
