#pragma once
// TensorBoard summaries: scalars, images and text in an event file that `tensorboard --logdir DIR`
// shows (summary/writer.hpp), and image tensors as PNG grids (summary/png_grid.hpp). Needs zlib (images
// are PNG); not part of <distribute/distribute.hpp>.
//
//   distribute::summary::writer w = strategy.is_chief() ? distribute::summary::writer("runs/exp1")
//                                                       : distribute::summary::writer::disabled();
//   w.scalar("loss/total", loss, step);

#include <distribute/summary/error.hpp>
#include <distribute/summary/png_grid.hpp>
#include <distribute/summary/writer.hpp>
