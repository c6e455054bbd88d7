// Package api is Tessera's public contract: the resource names pods request,
// the annotation keys Tessera reads and writes, the scheduler's name, the
// policy names, and the versioned wire formats (node GPU inventory, pod
// allocation record) with their codecs. Every other package uses these
// names and codecs; none defines its own.
//
// The package has no Kubernetes or NVML dependencies so that the placement
// core, the simulator and external tools can use it.
package api
