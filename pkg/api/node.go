package api

// LabelNodeConfig is the node label whose value names the node agent's
// configuration profile (a key of its ConfigMap); nodes without it use the
// profile "default".
const LabelNodeConfig = "tessera.io/node-config"
