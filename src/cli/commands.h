// The subcommands of `grass`, one file each (src/cli/cmd_*.cpp). Each gets its arguments after
// the command name and returns the process exit code; user errors are thrown as UserError and
// reported by main() as one line with exit code 2.
#pragma once
#include <string>
#include <vector>

namespace grass::cli {

using Args = std::vector<std::string>;

int cmd_train(const Args& args);
int cmd_mem(const Args& args);
int cmd_eval(const Args& args);
int cmd_prepare(const Args& args);
int cmd_tokenizer(const Args& args);
int cmd_export(const Args& args);

bool is_help(const std::string& arg);  // -h or --help

}  // namespace grass::cli
