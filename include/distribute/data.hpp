#pragma once
// The input pipeline in one include: datasets and their transforms, the sources (memory, IDX /
// Fashion-MNIST, image folders) and distributed datasets. The IDX sources need zlib and the image
// sources stb's headers: each is included when its dependency is visible, so that the rest works
// without them.

#include <distribute/data/error.hpp>
#include <distribute/data/tensor.hpp>
#include <distribute/data/to_tensor.hpp>

#include <distribute/data/dataset.hpp>

#include <distribute/data/from_memory.hpp>
#if __has_include(<zlib.h>)
#  include <distribute/data/idx.hpp>
#  include <distribute/data/fashion_mnist.hpp>
#endif
#if __has_include(<zlib.h>) && __has_include(<stb/stb_image.h>)
#  include <distribute/data/image.hpp>
#  include <distribute/data/image_folder.hpp>
#endif

#include <distribute/data/distribute.hpp>
