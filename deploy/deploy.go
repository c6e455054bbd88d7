// Package deploy ships the manifests and configuration files of this
// directory inside the binaries that need them (the emulated cluster runs
// the scheduler from the very configuration a cluster gets).
package deploy

import (
	_ "embed"

	"sigs.k8s.io/yaml"
)

// SchedulerConfig is scheduler/config.yaml, the KubeSchedulerConfiguration
// of `tessera scheduler`.
//
//go:embed scheduler/config.yaml
var SchedulerConfig []byte

// AdmissionPolicy is admission/policy.yaml: the ValidatingAdmissionPolicies
// (and bindings) that let only the scheduler write allocation records and
// only the node agents write inventories.
//
//go:embed admission/policy.yaml
var AdmissionPolicy []byte

// SchedulerManifest is scheduler/scheduler.yaml: the scheduler's
// namespace, ServiceAccount, RBAC and Deployment.
//
//go:embed scheduler/scheduler.yaml
var SchedulerManifest []byte

// NodeAgentManifest is node-agent/node-agent.yaml: the node agent's
// ServiceAccount, RBAC and DaemonSets.
//
//go:embed node-agent/node-agent.yaml
var NodeAgentManifest []byte

// SchedulerConfigFor is SchedulerConfig for a single replica that reaches
// its API server through kubeconfig at the given client rate, without
// leader election: how the emulated cluster and the integration tests run
// the shipped configuration.
func SchedulerConfigFor(kubeconfig string, qps, burst int) ([]byte, error) {
	var cfg map[string]any
	if err := yaml.Unmarshal(SchedulerConfig, &cfg); err != nil {
		return nil, err
	}
	cfg["leaderElection"] = map[string]any{"leaderElect": false}
	cfg["clientConnection"] = map[string]any{"kubeconfig": kubeconfig, "qps": qps, "burst": burst}
	return yaml.Marshal(cfg)
}

// DRA manifests (docs/dra.md): Tessera's DeviceClasses, the optional
// compatibility classes named as the GPU guides name them, and the
// admission policy for claims of those classes.
var (
	//go:embed dra/deviceclasses.yaml
	DRADeviceClasses []byte
	//go:embed dra/compat-deviceclasses.yaml
	DRACompatDeviceClasses []byte
	//go:embed dra/admission.yaml
	DRAAdmission []byte
)

// Volcano manifests (docs/volcano.md): the admission policy of Volcano's
// vGPU annotations, the node agents' extra RBAC on volcano nodes, and
// Volcano's device configuration with the MIG geometries of its mig mode.
var (
	//go:embed volcano/admission.yaml
	VolcanoAdmission []byte
	//go:embed volcano/node-agent-rbac.yaml
	VolcanoNodeAgentRBAC []byte
	//go:embed volcano/device-config.yaml
	VolcanoDeviceConfig []byte
)

// VolcanoSchedulerConf is volcano/scheduler.conf: Volcano's scheduler
// configuration with vGPU shares, queue capacity and preemption.
//
//go:embed volcano/scheduler.conf
var VolcanoSchedulerConf []byte
