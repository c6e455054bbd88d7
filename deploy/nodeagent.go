package deploy

import (
	_ "embed"
	"fmt"

	"sigs.k8s.io/yaml"
)

// NodeAgentConfigMap is node-agent/configmap.yaml, the node agents'
// profiles (the emulated cluster offers them all).
//
//go:embed node-agent/configmap.yaml
var NodeAgentConfigMap []byte

// NodeAgentProfiles are the profiles (data keys) of NodeAgentConfigMap.
func NodeAgentProfiles() (map[string]string, error) {
	var cm struct {
		Data map[string]string `json:"data"`
	}
	if err := yaml.Unmarshal(NodeAgentConfigMap, &cm); err != nil {
		return nil, fmt.Errorf("node-agent/configmap.yaml: %w", err)
	}
	return cm.Data, nil
}
