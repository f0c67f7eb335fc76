// The text of mooncake_helper.py, compiled into hsx (CMake embeds it), so that hsx needs
// no file beside its binary to reach Mooncake: it runs the text with `python3 -c`.
#pragma once

namespace hsx {
const char* MooncakeHelperSource();
}
