// Text for people: byte counts, durations, tensor shapes and hexadecimal ids, one spelling each
// wherever grass prints them.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace grass {

std::string format_bytes(int64_t bytes);  // "1.25 GiB", "310.0 MiB", "12.0 KiB", "512 B"
std::string human_duration(double seconds);  // "45s", "12m05s", "3h07m"
std::string shape_str(const std::vector<int64_t>& shape);  // "[4096, 11008]"
std::string hex64(uint64_t value);  // "0x00000000deadbeef": checksums and hashes in messages
std::string hex32(uint32_t value);  // "deadbeef": the CRC-32s of checkpoint manifests

}  // namespace grass
