// The subcommands of `grass`, one file each (src/cli/cmd_*.cpp). Each gets its arguments after
// the command name and returns the process exit code; user errors are thrown as UserError and
// reported by main() as one line with exit code 2.
#pragma once
#include <string>
#include <vector>

#include "src/dist/communicator.h"

namespace grass::cli {

using Args = std::vector<std::string>;

int cmd_train(const Args& args);
int cmd_mem(const Args& args);
int cmd_eval(const Args& args);
int cmd_prepare(const Args& args);
int cmd_tokenizer(const Args& args);
int cmd_export(const Args& args);
int cmd_sample(const Args& args);

bool is_help(const std::string& arg);  // -h or --help
// The ranks this process is one of: MPI's when mpirun (or srun) started it, else one process.
Communicator& communicator();

}  // namespace grass::cli
