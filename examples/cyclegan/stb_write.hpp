#pragma once
// stb_image_write (PNG encoding) and stb_easy_font (text as quads), compiled into this translation
// unit as private (static) functions, as the library does with stb_image: nothing to link.
#pragma GCC system_header  // stb's code is not ours to warn about

#define STB_IMAGE_WRITE_STATIC
#define STB_IMAGE_WRITE_IMPLEMENTATION
#include <stb/stb_image_write.h>
#undef STB_IMAGE_WRITE_IMPLEMENTATION
#include <stb/stb_easy_font.h>
