#pragma once
// stb_image (PNG and JPEG decoding from memory) and stb_image_resize, compiled into every
// translation unit that includes this header as private (static) functions: the library stays
// header-only and needs no link step for them. Include <stb/stb_image.h> yourself only after this
// header, or in another translation unit (the two copies must not meet in one file).
#pragma GCC system_header

// Everything stb includes, first, so that the memcpy macro below cannot touch their declarations.
#include <assert.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

namespace distribute::data::detail {
// stb_image calls memcpy(dst, src, 0) with a null dst for an empty PNG chunk: harmless, but
// undefined behaviour that UBSan stops at (found by tests/fuzz/fuzz_image). A zero-length copy here
// touches no pointer.
inline void* stb_memcpy(void* dst, const void* src, size_t n) noexcept { return n ? memcpy(dst, src, n) : dst; }
}  // namespace distribute::data::detail
#define memcpy(dst, src, n) ::distribute::data::detail::stb_memcpy(dst, src, n)

#define STB_IMAGE_STATIC
#define STB_IMAGE_IMPLEMENTATION
#define STBI_ONLY_PNG
#define STBI_ONLY_JPEG
#define STBI_NO_STDIO
#define STBI_NO_HDR
#define STBI_NO_LINEAR
#include <stb/stb_image.h>
#undef STB_IMAGE_IMPLEMENTATION

#define STB_IMAGE_RESIZE_STATIC
#define STB_IMAGE_RESIZE_IMPLEMENTATION
#include <stb/stb_image_resize.h>
#undef STB_IMAGE_RESIZE_IMPLEMENTATION

#undef memcpy
