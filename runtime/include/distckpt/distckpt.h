// Umbrella header of the distckpt runtime.
#pragma once

#include "distckpt/api/async.h"
#include "distckpt/api/checkpoint.h"
#include "distckpt/api/options.h"
#include "distckpt/api/plan_cache.h"
#include "distckpt/comm/communicator.h"
#include "distckpt/comm/process_group.h"
#include "distckpt/core/dict_utils.h"
#include "distckpt/core/errors.h"
#include "distckpt/core/log.h"
#include "distckpt/core/sharded_object.h"
#include "distckpt/core/sharded_tensor.h"
#include "distckpt/core/state_dict.h"
#include "distckpt/format/checkpoint_config.h"
#include "distckpt/local/local_checkpoint_manager.h"
#include "distckpt/local/tensor_aware_state_dict.h"
