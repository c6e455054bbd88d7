// Package deploy ships the manifests and configuration files of this
// directory inside the binaries that need them (the emulated cluster runs
// the scheduler from the very configuration a cluster gets).
package deploy

import _ "embed"

// SchedulerConfig is scheduler/config.yaml, the KubeSchedulerConfiguration
// of `tessera scheduler`.
//
//go:embed scheduler/config.yaml
var SchedulerConfig []byte
