#pragma once
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <thread>
#include <vector>
