// What a run may do with the out_dir it is given, decided before anything is written: nothing a
// user made is lost by a rerun. An out_dir is written into when it is absent or empty, or when it
// holds this run with checkpoints to resume from; anything else (an export, another run, an
// unrelated folder, a finished run, a run without checkpoints whose results a rerun would
// replace) is refused in one line that names what is there and the ways out: a new out_dir, or
// --overwrite, which moves the old contents aside to <out_dir>.old-N.
#pragma once
#include <string>

#include "src/config/config.h"

namespace grass {

// UserError (one line) when `grass train` must not write into cfg.out_dir. "This run" means a
// run config (out_dir/config.json, or its newest checkpoint's) equal to cfg on every key that
// changes results (changes_results), `steps` aside: raising steps extends a run. A key the saved
// config lacks (written by an older grass) is not compared. With `explicit_resume` (--resume),
// another run's config is accepted (the resume warns about each key that differs) and a run
// without checkpoints there too, since the named checkpoint is where it continues from.
// A finished run with checkpoints passes here: see finished_run_error. So does a run with
// checkpoint_every that was stopped before its first checkpoint and left no model: it starts
// again from step 0, as from a checkpoint there (the note says so).
// Returns "" or, for a run that starts again, a note for the start-up table's resume line.
std::string check_out_dir(const RunConfig& cfg, bool explicit_resume);

// The refusal for a run whose newest complete checkpoint in out_dir, at `step`, is at its steps
// already (decided once the checkpoint has been verified: a damaged newer one does not count).
std::string finished_run_error(const RunConfig& cfg, int64_t step);

// Whether out_dir holds anything but the lock file.
bool out_dir_has_contents(const std::string& out_dir);

// --overwrite: renames out_dir to the first free <out_dir>.old-N (N = 1, 2, ...), and returns that
// name. UserError when another process trains into it (its lock) or the rename fails.
std::string move_out_dir_aside(const std::string& out_dir);

}  // namespace grass
