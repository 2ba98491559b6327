#!/usr/bin/python3
"""Build step: turns a file into a C++ source defining one function that
returns its bytes (a std::string_view over a constant array).

Usage: embed.py INPUT OUTPUT FUNCTION   (FUNCTION in tokenmeter::daemon::live)
"""
import sys


def main():
    src, out, function = sys.argv[1:4]
    with open(src, "rb") as f:
        data = f.read()
    lines = []
    for i in range(0, len(data), 16):
        lines.append("    " + ", ".join(f"0x{b:02x}" for b in data[i:i + 16])
                     + ",")
    text = (
        f"// Generated from {src} by daemon/live/embed.py: do not edit.\n"
        "#include <string_view>\n\n"
        "#include \"daemon/live/live_json.h\"\n\n"
        "namespace tokenmeter::daemon::live {\n"
        "namespace {\n"
        "constexpr char kBytes[] = {\n" + "\n".join(lines) + "\n    0x00};\n"
        "}  // namespace\n\n"
        f"std::string_view {function}() {{\n"
        f"  return {{kBytes, {len(data)}}};\n}}\n\n"
        "}  // namespace tokenmeter::daemon::live\n")
    with open(out, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
