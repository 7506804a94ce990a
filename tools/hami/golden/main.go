// Command golden runs HAMi's own encoders and decoders on the cases tools/hami/golden.py
// gives it (JSON on stdin) and prints what they return (JSON on stdout). golden.py builds
// it in a scratch module that requires HAMi (never copied into this repository) and keeps
// the answers as the fixture tests/wire/hami/golden-<version>.json.
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/Project-HAMi/HAMi/pkg/device"
	"github.com/Project-HAMi/HAMi/pkg/util/nodelock"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

const devType = "NVIDIA"

// The annotation HAMi's NVIDIA device reads and writes a pod's devices under.
var checklist = map[string]string{devType: "hami.io/vgpu-devices-to-allocate"}

type dev struct {
	UUID      string `json:"uuid"`
	Type      string `json:"type"`
	Usedmem   int32  `json:"usedmem"`
	Usedcores int32  `json:"usedcores"`
}

type podCase struct {
	Name       string  `json:"name"`
	Containers [][]dev `json:"containers,omitempty"`
	Annotation *string `json:"annotation,omitempty"`
}

type textCase struct {
	Name string `json:"name"`
	Text string `json:"text"`
}

type devicesCase struct {
	Name    string               `json:"name"`
	Devices []*device.DeviceInfo `json:"devices"`
}

type lockKeyCase struct {
	Unix      int64  `json:"unix"`
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
}

type input struct {
	Pods      []podCase     `json:"pods"`
	Registers []textCase    `json:"registers"`
	Devices   []devicesCase `json:"devices"`
	Locks     []textCase    `json:"locks"`
	LockKeys  []lockKeyCase `json:"lock_keys"`
}

func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

func toDevs(cd device.ContainerDevices) []dev {
	out := []dev{}
	for _, d := range cd {
		out = append(out, dev{d.UUID, d.Type, d.Usedmem, d.Usedcores})
	}
	return out
}

func pod(c podCase) map[string]any {
	out := map[string]any{"name": c.Name}
	if c.Containers != nil {
		single := device.PodSingleDevice{}
		for _, devs := range c.Containers {
			cd := device.ContainerDevices{}
			for _, d := range devs {
				cd = append(cd, device.ContainerDevice{
					UUID: d.UUID, Type: d.Type, Usedmem: d.Usedmem, Usedcores: d.Usedcores,
				})
			}
			single = append(single, cd)
		}
		out["containers"] = c.Containers
		out["encoded"] = device.EncodePodDevices(checklist, device.PodDevices{devType: single})
	}
	if c.Annotation != nil {
		out["annotation"] = *c.Annotation
		pd, err := device.DecodePodDevices(checklist, map[string]string{checklist[devType]: *c.Annotation})
		decoded := [][]dev{}
		for _, cd := range pd[devType] {
			decoded = append(decoded, toDevs(cd))
		}
		out["decoded"], out["error"] = decoded, errText(err)
	}
	return out
}

func register(c textCase) map[string]any {
	j, jerr := device.UnMarshalNodeDevices(c.Text)
	l, lerr := device.DecodeNodeDevices(c.Text)
	return map[string]any{
		"name": c.Name, "text": c.Text,
		"json": j, "json_error": errText(jerr),
		"legacy": l, "legacy_error": errText(lerr),
	}
}

func main() {
	var in input
	dec := json.NewDecoder(os.Stdin)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		fmt.Fprintln(os.Stderr, "golden: bad input:", err)
		os.Exit(2)
	}
	out := map[string][]map[string]any{
		"pods": {}, "registers": {}, "devices": {}, "locks": {}, "lock_keys": {},
	}
	for _, c := range in.Pods {
		out["pods"] = append(out["pods"], pod(c))
	}
	for _, c := range in.Registers {
		out["registers"] = append(out["registers"], register(c))
	}
	for _, c := range in.Devices {
		out["devices"] = append(out["devices"], map[string]any{
			"name": c.Name, "devices": c.Devices,
			"json":   device.MarshalNodeDevices(c.Devices),
			"legacy": device.EncodeNodeDevices(c.Devices),
		})
	}
	for _, c := range in.Locks {
		t, ns, name, err := nodelock.ParseNodeLock(c.Text)
		out["locks"] = append(out["locks"], map[string]any{
			"name": c.Name, "text": c.Text,
			"unix": t.Unix(), "namespace": ns, "pod": name, "error": errText(err),
		})
	}
	for _, c := range in.LockKeys {
		// GenerateNodeLockKeyByPod with the clock fixed: time.Now() there, in UTC here
		// (HAMi writes the node's zone; every reader parses the offset).
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: c.Namespace, Name: c.Name}}
		stamp := time.Unix(c.Unix, 0).UTC().Format(time.RFC3339)
		out["lock_keys"] = append(out["lock_keys"], map[string]any{
			"unix": c.Unix, "namespace": c.Namespace, "name": c.Name,
			"value": stamp + nodelock.NodeLockSep + nodelock.GeneratePodNamespaceName(p, nodelock.NodeLockSep),
		})
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(out); err != nil {
		os.Exit(3)
	}
}
