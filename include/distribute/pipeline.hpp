#pragma once
// Pipeline parallelism: stages on replicas, micro-batches through them, and the mesh of stages x
// copies (pipeline/pipeline.hpp, pipeline/options.hpp, pipeline/schedule.hpp).

#include <distribute/pipeline/options.hpp>
#include <distribute/pipeline/pipeline.hpp>
#include <distribute/pipeline/schedule.hpp>
