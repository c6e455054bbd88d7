package clusterview

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"sigs.k8s.io/yaml"
)

// Output formats of the views (kubectl's -o).
const (
	OutputTable = ""
	OutputWide  = "wide"
	OutputJSON  = "json"
	OutputYAML  = "yaml"
)

// CheckOutput rejects an output format the views do not have.
func CheckOutput(o string) error {
	switch o {
	case OutputTable, OutputWide, OutputJSON, OutputYAML:
		return nil
	}
	return fmt.Errorf("output format %q not supported: use wide, json or yaml", o)
}

// Encode writes v as JSON or YAML.
func Encode(w io.Writer, format string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	if format == OutputYAML {
		if b, err = yaml.JSONToYAML(b); err != nil {
			return err
		}
	} else {
		b = append(b, '\n')
	}
	_, err = w.Write(b)
	return err
}

// PrintNodes writes one line per GPU: its node, index, model, health,
// sharing mode, memory and cores allocated of its total, shares held of
// its maximum, and the pods holding it (wide: the UUID and MIG devices
// too, and every pod).
func (r *Report) PrintNodes(w io.Writer, format string) error {
	if format == OutputJSON || format == OutputYAML {
		return Encode(w, format, r.Nodes)
	}
	wide := format == OutputWide
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	head := "NODE\tGPU\tMODEL\tHEALTH\tSHARING\tMEMORY (MiB)\tCORES\tSHARES\tPODS"
	if wide {
		head += "\tUUID\tMIG DEVICES"
	}
	fmt.Fprintln(tw, head)
	for _, n := range r.Nodes {
		for _, g := range n.GPUs {
			health := "healthy"
			if !g.Healthy {
				health = "unhealthy"
			}
			shares := fmt.Sprintf("%d/%d", g.Shares, g.MaxShares)
			if g.Exclusive {
				shares = "whole"
			}
			pods := holders(g, wide)
			line := fmt.Sprintf("%s\t%d\t%s\t%s\t%s\t%d/%d\t%d%%\t%s\t%s", n.Name, g.Index, g.Model, health, g.Sharing,
				g.UsedMiB, g.MemoryMiB, g.Cores, shares, pods)
			if wide {
				mig := strings.Join(g.MIGDevices, ",")
				if mig == "" {
					mig = "-"
				}
				line += "\t" + g.UUID + "\t" + mig
			}
			fmt.Fprintln(tw, line)
		}
	}
	return tw.Flush()
}

// PrintPods writes one line per container grant of the GPU pods in
// namespace ("" = all): pod, container, node, GPU index, memory limit,
// core share (wide: the GPU's UUID, the MIG profile and the GPU's
// sharing mode).
func (r *Report) PrintPods(w io.Writer, namespace, format string) error {
	var pods []PodReport
	for _, p := range r.Pods {
		if namespace == "" || p.Namespace == namespace {
			pods = append(pods, p)
		}
	}
	if format == OutputJSON || format == OutputYAML {
		if pods == nil {
			pods = []PodReport{}
		}
		return Encode(w, format, pods)
	}
	wide := format == OutputWide
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	head := "NAMESPACE\tPOD\tCONTAINER\tNODE\tGPU\tMEMORY (MiB)\tCORES"
	if wide {
		head += "\tUUID\tMIG\tSHARING\tCLAIM"
	}
	fmt.Fprintln(tw, head)
	for _, p := range pods {
		for _, c := range p.Containers {
			name := c.Name
			if c.Init {
				name += " (init)"
			}
			for _, d := range c.Devices {
				gpu := fmt.Sprint(d.GPU)
				if d.GPU < 0 {
					gpu = "?"
				}
				mem, cores := fmt.Sprint(d.MemoryMiB), fmt.Sprintf("%d%%", d.Cores)
				if d.Exclusive {
					cores += " (whole)"
				}
				if d.MIGProfile != "" {
					mem, cores = "-", "mig "+d.MIGProfile
				}
				line := fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s\t%s", p.Namespace, p.Name, name, p.Node, gpu, mem, cores)
				if wide {
					line += fmt.Sprintf("\t%s\t%s\t%s\t%s", d.UUID, dash(d.MIGProfile), dash(d.Sharing), dash(d.Claim))
				}
				fmt.Fprintln(tw, line)
			}
		}
	}
	return tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
