// Small helpers the subcommands share for reading "--name value" / "--name=value" options.
#pragma once
#include <cstdint>
#include <string>

#include "src/cli/commands.h"

namespace grass::cli {

// True when args[i] is option `name`; sets `value` from "--name=value" or from the next argument
// (advancing i). UserError when the value is missing.
bool take_option(const Args& args, size_t& i, const std::string& name, std::string& value);

// `text` as an integer >= min, or a UserError naming the option.
uint64_t parse_count(const std::string& name, const std::string& text, uint64_t min);
// `text` as a finite number > 0, or a UserError naming the option.
double parse_positive(const std::string& name, const std::string& text);

}  // namespace grass::cli
