package api

// LabelNodeConfig is the node label whose value names the node agent's
// configuration profile (a key of its ConfigMap); nodes without it use the
// profile "default".
const LabelNodeConfig = "tessera.io/node-config"

// LabelMIGConfig is NVIDIA's mig-manager label: its value names the
// mig-parted layout (a key of a mig-configs document) the node's GPUs are
// partitioned by. The node agent honours it as mig-manager does.
const LabelMIGConfig = "nvidia.com/mig.config"
