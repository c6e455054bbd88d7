// Command tessera-lab-init is the first process of every container of the
// emulated cluster's process runtime (internal/hollowkubelet): started by
// the runtime in new namespaces, it sets up the container
// (internal/hollowkubelet/cinit) and executes the container's command. It
// is a binary of its own, apart from tessera-lab, because it runs once per
// container start and must start in a millisecond, not in the tenth of a
// second a binary carrying the control plane takes.
package main

import "github.com/tessera-gpu/tessera/internal/hollowkubelet/cinit"

func main() { cinit.Main() }
