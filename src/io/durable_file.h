// Writing files so that a crash (a kill, a power cut) leaves the old file or the new one, never a
// mix: write to "<path>.tmp", fsync, rename over <path>, and fsync the directory so the rename
// itself is on disk. Used for checkpoints and exports.
#pragma once
#include <cstdio>
#include <functional>
#include <string>
#include <string_view>

namespace grass {

// Writes path as above, its contents from `write`, which returns false when an fwrite failed.
void write_durably(const std::string& path, const std::function<bool(std::FILE*)>& write);

// Writes `bytes` to path as above. UserError naming the file on any failure (a full disk, no
// permission); the temporary file is removed and an existing <path> is left as it was.
void write_file_durably(const std::string& path, std::string_view bytes);

// Copies a file the same way. UserError naming the source or destination.
void copy_file_durably(const std::string& source, const std::string& destination);

// fsync of a directory, so that files created or renamed in it survive a crash. UserError naming
// the directory (file systems that cannot sync directories, EINVAL, are accepted silently).
void fsync_directory(const std::string& dir);

}  // namespace grass
