package clusterview

import (
	"fmt"
	"io"
	"sort"
	"text/tabwriter"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// TopRow is one container's use of one GPU, from the node agents'
// metrics (docs/operations.md, "Metrics").
type TopRow struct {
	Namespace string `json:"namespace"`
	Pod       string `json:"pod"`
	Container string `json:"container"`
	Node      string `json:"node"`
	GPU       string `json:"gpu"`
	UUID      string `json:"uuid"`
	// Claim is the DRA ResourceClaim the series is of (the metrics'
	// claim label; a claim shared by several containers or pods has one
	// limit and one series).
	Claim string `json:"claim,omitempty"`
	// UsedBytes/LimitBytes: GPU memory held (limiter accounting) and the
	// limit; SMUse/SMShare in percent of the GPU's SMs (SMUse -1: no
	// NVML process samples).
	UsedBytes  float64 `json:"usedBytes"`
	LimitBytes float64 `json:"limitBytes"`
	SMUse      float64 `json:"smUse"`
	SMShare    float64 `json:"smShare"`
}

// ParseTop reads the per-container series of one agent's /metrics.
func ParseTop(r io.Reader) ([]TopRow, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return nil, fmt.Errorf("parsing the node agent's metrics: %w", err)
	}
	rows := map[string]*TopRow{}
	var order []string
	get := func(m *dto.Metric) *TopRow {
		l := map[string]string{}
		for _, lp := range m.Label {
			l[lp.GetName()] = lp.GetValue()
		}
		k := l["namespace"] + "/" + l["pod"] + "/" + l["container"] + "/" + l["claim"] + "/" + l["Hostname"] + "/" + l["UUID"]
		row := rows[k]
		if row == nil {
			row = &TopRow{Namespace: l["namespace"], Pod: l["pod"], Container: l["container"], Node: l["Hostname"], GPU: l["gpu"], UUID: l["UUID"], Claim: l["claim"], SMUse: -1}
			rows[k] = row
			order = append(order, k)
		}
		return row
	}
	for name, set := range map[string]func(*TopRow, float64){
		"tessera_container_memory_used_bytes":      func(r *TopRow, v float64) { r.UsedBytes = v },
		"tessera_container_memory_limit_bytes":     func(r *TopRow, v float64) { r.LimitBytes = v },
		"tessera_container_sm_utilization_percent": func(r *TopRow, v float64) { r.SMUse = v },
		"tessera_container_sm_share_percent":       func(r *TopRow, v float64) { r.SMShare = v },
	} {
		for _, m := range fams[name].GetMetric() {
			set(get(m), m.GetGauge().GetValue())
		}
	}
	out := make([]TopRow, 0, len(order))
	for _, k := range order {
		out = append(out, *rows[k])
	}
	return out, nil
}

// PrintTop writes the rows of namespace ("" = all), sorted.
func PrintTop(w io.Writer, rows []TopRow, namespace, format string) error {
	var sel []TopRow
	for _, r := range rows {
		if namespace == "" || r.Namespace == namespace {
			sel = append(sel, r)
		}
	}
	sort.Slice(sel, func(i, j int) bool {
		a, b := sel[i], sel[j]
		if a.Namespace+"/"+a.Pod+"/"+a.Container != b.Namespace+"/"+b.Pod+"/"+b.Container {
			return a.Namespace+"/"+a.Pod+"/"+a.Container < b.Namespace+"/"+b.Pod+"/"+b.Container
		}
		return a.Node+a.GPU < b.Node+b.GPU
	})
	if format == OutputJSON || format == OutputYAML {
		if sel == nil {
			sel = []TopRow{}
		}
		return Encode(w, format, sel)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	head := "NAMESPACE\tPOD\tCONTAINER\tNODE\tGPU\tMEMORY USED/LIMIT (MiB)\tMEMORY %\tSM USE/SHARE"
	if format == OutputWide {
		head += "\tUUID\tCLAIM"
	}
	fmt.Fprintln(tw, head)
	for _, r := range sel {
		pct := "-"
		if r.LimitBytes > 0 {
			pct = fmt.Sprintf("%.0f%%", 100*r.UsedBytes/r.LimitBytes)
		}
		sm := "-"
		if r.SMUse >= 0 {
			sm = fmt.Sprintf("%.0f%%", r.SMUse)
		}
		pod, container := dash(r.Pod), dash(r.Container)
		if r.Pod == "" && r.Claim != "" {
			pod = "claim " + r.Claim
		}
		line := fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%.0f/%.0f\t%s\t%s/%.0f%%", r.Namespace, pod, container, r.Node, r.GPU,
			r.UsedBytes/(1<<20), r.LimitBytes/(1<<20), pct, sm, r.SMShare)
		if format == OutputWide {
			line += "\t" + r.UUID + "\t" + dash(r.Claim)
		}
		fmt.Fprintln(tw, line)
	}
	return tw.Flush()
}
