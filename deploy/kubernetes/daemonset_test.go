package kubernetes

import (
	"os"
	"slices"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// load strictly decodes the single object of file into T.
func load[T any](t *testing.T, file string) T {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	obj, err := decode(data)
	if err != nil {
		t.Fatalf("%s: %v", file, err)
	}
	v, ok := obj.(T)
	if !ok {
		t.Fatalf("%s holds %T", file, obj)
	}
	return v
}

// TestDaemonSet checks what the manifests promise: host network, the
// README's capabilities and not privileged, bpffs and /run/tierlimit from
// the host, the NIC from the tierlimit-node ConfigMap, the policy ConfigMap
// mounted as a directory (a subPath mount never sees an update), probes on
// /healthz, requests and limits, and a PodMonitor and Service that select
// the pods and name their metrics port.
func TestDaemonSet(t *testing.T) {
	ds := load[*appsv1.DaemonSet](t, "daemonset.yaml")
	pod := ds.Spec.Template.Spec
	if !pod.HostNetwork {
		t.Error("hostNetwork is false")
	}
	if len(pod.Containers) != 1 {
		t.Fatalf("%d containers, want 1", len(pod.Containers))
	}
	c := pod.Containers[0]
	checkSecurityContext(t, c)

	mounts, volumes := checkHostMounts(t, pod, c)
	pm := mounts["/etc/tierlimit"]
	if v := volumes[pm.Name]; v.ConfigMap == nil || v.ConfigMap.Name != "tierlimit-policy" || pm.SubPath != "" {
		t.Errorf("/etc/tierlimit: mount %+v of %+v, want the tierlimit-policy ConfigMap as a directory", pm, v)
	}
	if !slices.Contains(c.Args, "--config=/etc/tierlimit/policy.yaml") || !slices.Contains(c.Args, "--iface=$(TIERLIMIT_IFACE)") {
		t.Errorf("args %v: want the policy file and --iface from TIERLIMIT_IFACE", c.Args)
	}
	var ifaceFrom *corev1.ConfigMapKeySelector
	for _, e := range c.Env {
		if e.Name == "TIERLIMIT_IFACE" && e.ValueFrom != nil {
			ifaceFrom = e.ValueFrom.ConfigMapKeyRef
		}
	}
	node := load[*corev1.ConfigMap](t, "node-config.yaml")
	if ifaceFrom == nil || ifaceFrom.Name != node.Name || node.Data[ifaceFrom.Key] == "" {
		t.Errorf("TIERLIMIT_IFACE from %+v, want a key of ConfigMap %s (%v)", ifaceFrom, node.Name, node.Data)
	}
	policy := load[*corev1.ConfigMap](t, "policy.yaml")
	if def, _ := os.ReadFile("../../tiers/default.yaml"); policy.Data["policy.yaml"] != string(def) {
		t.Error("the tierlimit-policy ConfigMap's policy.yaml is not tiers/default.yaml")
	}

	for name, p := range map[string]*corev1.Probe{"liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != "/healthz" || p.HTTPGet.Port.String() != "metrics" {
			t.Errorf("%s probe %+v, want GET /healthz on the metrics port", name, p)
		}
	}
	if len(c.Ports) != 1 || c.Ports[0].Name != "metrics" || c.Ports[0].ContainerPort != 9713 ||
		!slices.Contains(c.Args, "--metrics-addr=[$(POD_IP)]:9713") {
		t.Errorf("ports %+v, args %v: want metrics on 9713 at the pod's (the node's) address", c.Ports, c.Args)
	}
	for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if c.Resources.Requests.Name(r, "").IsZero() || c.Resources.Limits.Name(r, "").IsZero() {
			t.Errorf("resources %+v: want requests and limits for %s", c.Resources, r)
		}
	}

	podLabels := labels.Set(ds.Spec.Template.Labels)
	svc := load[*corev1.Service](t, "service.yaml")
	if !labels.SelectorFromSet(svc.Spec.Selector).Matches(podLabels) || svc.Spec.Ports[0].TargetPort.String() != "metrics" {
		t.Errorf("Service selector %v / target port %v do not reach the pods' metrics", svc.Spec.Selector, svc.Spec.Ports[0].TargetPort)
	}
	mon := load[*monitoringv1.PodMonitor](t, "podmonitor.yaml")
	sel := labels.SelectorFromSet(mon.Spec.Selector.MatchLabels)
	if !sel.Matches(podLabels) || len(mon.Spec.PodMetricsEndpoints) != 1 || mon.Spec.PodMetricsEndpoints[0].Port == nil ||
		*mon.Spec.PodMetricsEndpoints[0].Port != "metrics" || !strings.HasPrefix(mon.Spec.PodMetricsEndpoints[0].Path, "/metrics") {
		t.Errorf("PodMonitor %+v does not scrape the pods' metrics port", mon.Spec)
	}
}

// checkSecurityContext checks the container's capabilities: the README's
// three added, ALL dropped, no privilege or escalation.
func checkSecurityContext(t *testing.T, c corev1.Container) {
	t.Helper()
	sc := c.SecurityContext
	if sc == nil || sc.Capabilities == nil || (sc.Privileged != nil && *sc.Privileged) {
		t.Fatalf("securityContext %+v: want capabilities and not privileged", sc)
	}
	var add []string
	for _, cp := range sc.Capabilities.Add {
		add = append(add, string(cp))
	}
	if want := []string{"NET_ADMIN", "BPF", "PERFMON"}; !slices.Equal(add, want) {
		t.Errorf("capabilities add %v, want the README's %v", add, want)
	}
	for _, doc := range []struct{ file, says string }{
		{"../../README.md", "CAP_NET_ADMIN plus CAP_BPF and CAP_PERFMON"},
		{"../../docs/operations.md", "the capabilities NET_ADMIN, BPF and PERFMON added and ALL dropped"},
	} {
		data, err := os.ReadFile(doc.file)
		if err != nil || !strings.Contains(strings.Join(strings.Fields(string(data)), " "), doc.says) {
			t.Errorf("%s does not say %q (%v): the capabilities the manifest and the docs give differ", doc.file, doc.says, err)
		}
	}
	if !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Errorf("capabilities drop %v, allowPrivilegeEscalation %v: want ALL and false", sc.Capabilities.Drop, sc.AllowPrivilegeEscalation)
	}
}

// checkHostMounts checks that bpffs and /run/tierlimit come from the host,
// and returns the container's mounts by path and the pod's volumes by name.
func checkHostMounts(t *testing.T, pod corev1.PodSpec, c corev1.Container) (map[string]corev1.VolumeMount, map[string]corev1.Volume) {
	t.Helper()
	mounts := map[string]corev1.VolumeMount{}
	for _, m := range c.VolumeMounts {
		mounts[m.MountPath] = m
	}
	volumes := map[string]corev1.Volume{}
	for _, v := range pod.Volumes {
		volumes[v.Name] = v
	}
	for _, path := range []string{"/sys/fs/bpf", "/run/tierlimit"} {
		v := volumes[mounts[path].Name]
		if v.HostPath == nil || v.HostPath.Path != path {
			t.Errorf("%s: volume %+v, want hostPath %s", path, v, path)
		}
	}
	return mounts, volumes
}
