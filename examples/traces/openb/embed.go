// Package openb embeds the default openb trace so that `tessera-sim`
// works from any directory with no flags. See README.md for attribution.
package openb

import "embed"

// Files holds the node and pod lists.
//
//go:embed openb_node_list_gpu_node.csv openb_pod_list_default.csv
var Files embed.FS

// The embedded file names.
const (
	NodeList = "openb_node_list_gpu_node.csv"
	PodList  = "openb_pod_list_default.csv"
)
