package kubernetes

import (
	"fmt"
	"net/url"
	"os"
	"path"
	"regexp"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/kustomize/api/krusty"
	kusttypes "sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// fleetDir is the fleet overlay: beside the base, not under it, which
// kustomize refuses as a cycle.
const fleetDir = "../kubernetes-fleet"

// fleetOnlyKinds are the kinds of types that only the fleet overlay holds.
var fleetOnlyKinds = []string{"v1/Secret", "apps/v1/StatefulSet"}

// fleetObjects builds the fleet overlay (kustomize's own library) and
// strictly decodes every object it renders, by kind and name.
func fleetObjects(t *testing.T) map[string]any {
	t.Helper()
	res, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), fleetDir)
	if err != nil {
		t.Fatalf("kustomize build %s: %v", fleetDir, err)
	}
	out, err := res.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	objs := map[string]any{}
	for _, doc := range documents(out) {
		obj, err := decode(doc)
		if err != nil {
			t.Errorf("kustomize build %s: %v", fleetDir, err)
			continue
		}
		m := obj.(metav1.Object)
		if _, isNS := obj.(*corev1.Namespace); !isNS && m.GetNamespace() != "tierlimit" {
			t.Errorf("%T %s: namespace %q, want tierlimit", obj, m.GetName(), m.GetNamespace())
		}
		if m.GetLabels()["app.kubernetes.io/part-of"] != "tierlimit" {
			t.Errorf("%T %s: labels %v, want part-of tierlimit", obj, m.GetName(), m.GetLabels())
		}
		objs[fmt.Sprintf("%T/%s", obj, m.GetName())] = obj
	}
	return objs
}

func get[T any](t *testing.T, objs map[string]any, name string) T {
	t.Helper()
	var zero T
	o, ok := objs[fmt.Sprintf("%T/%s", zero, name)].(T)
	if !ok {
		t.Fatalf("kustomize build %s renders no %T %s", fleetDir, zero, name)
	}
	return o
}

// fleetPolicy is the fleet: block of a policy, as far as the overlay
// wires it.
type fleetPolicy struct {
	Fleet struct {
		Name         string `json:"name"`
		Store        string `json:"store"`
		PasswordFile string `json:"password_file"`
		Max          uint64 `json:"max"`
	} `json:"fleet"`
}

// TestFleetOverlay: the fleet overlay (docs/design.md §12) builds, every
// object decodes strictly, and the parts name each other: the policy's
// fleet.store is the store's Service, as the ACL user of the store's
// ACL; its password_file is the Secret's member key mounted into the
// DaemonSet; the ACL limits that user to the keys of the policy's
// fleet.name and is agent/fleet's; the store reads the Secret and the
// start script; and the base's DaemonSet keeps what TestDaemonSet checks.
func TestFleetOverlay(t *testing.T) {
	data, err := os.ReadFile(path.Join(fleetDir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var k kusttypes.Kustomization
	if err := yaml.UnmarshalStrict(data, &k); err != nil {
		t.Fatalf("%s/kustomization.yaml: %v", fleetDir, err)
	}
	objs := fleetObjects(t)

	cm := get[*corev1.ConfigMap](t, objs, "tierlimit-policy")
	var pol fleetPolicy
	if err := yaml.Unmarshal([]byte(cm.Data["policy.yaml"]), &pol); err != nil {
		t.Fatalf("the policy: %v", err)
	}
	f := pol.Fleet
	if f.Name == "" || f.Max == 0 || f.PasswordFile == "" {
		t.Fatalf("the policy's fleet %+v: want name, max and password_file", f)
	}
	u, err := url.Parse(f.Store)
	if err != nil {
		t.Fatalf("fleet.store %q: %v", f.Store, err)
	}
	if _, has := u.User.Password(); has {
		t.Errorf("fleet.store %q holds a password", f.Store)
	}

	svc := get[*corev1.Service](t, objs, "tierlimit-fleet-store")
	if want := fmt.Sprintf("%s.%s.svc:%d", svc.Name, svc.Namespace, svc.Spec.Ports[0].Port); u.Scheme != "redis" || u.Host != want {
		t.Errorf("fleet.store %q: want redis://USER@%s", f.Store, want)
	}
	sts := get[*appsv1.StatefulSet](t, objs, "tierlimit-fleet-store")
	pod := sts.Spec.Template.Spec
	if !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(sts.Spec.Template.Labels)) ||
		svc.Spec.Ports[0].TargetPort.String() != pod.Containers[0].Ports[0].Name || pod.Containers[0].Ports[0].ContainerPort != 6379 {
		t.Errorf("the store's Service %v → %v does not reach the StatefulSet's pods %v port %+v",
			svc.Spec.Selector, svc.Spec.Ports[0].TargetPort, sts.Spec.Template.Labels, pod.Containers[0].Ports)
	}
	if img := pod.Containers[0].Image; !strings.HasPrefix(img, "valkey/valkey:") {
		t.Errorf("the store's image %q: the images entry did not apply", img)
	}
	if sc := pod.Containers[0].SecurityContext; sc == nil || sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem ||
		pod.SecurityContext == nil || pod.SecurityContext.RunAsNonRoot == nil || !*pod.SecurityContext.RunAsNonRoot {
		t.Errorf("the store runs as root or writes its root: %+v, %+v", pod.SecurityContext, sc)
	}

	// The store: the start script and the Secret, where the script reads them.
	storeCM := get[*corev1.ConfigMap](t, objs, "tierlimit-fleet-store")
	secret := get[*corev1.Secret](t, objs, "tierlimit-fleet")
	store := pod.Containers[0]
	script := storeCM.Data["start.sh"]
	if c := pod.Containers[0].Command; len(c) != 2 || c[1] != path.Join(mountedAt(pod, store, "configMap", storeCM.Name), "start.sh") {
		t.Errorf("the store's command %v: want start.sh of ConfigMap %s", c, storeCM.Name)
	}
	for _, want := range []string{
		"${FLEET_SECRETS:-" + mountedAt(pod, store, "secret", secret.Name) + "}",
		"${FLEET_STORE_CONF:-" + mountedAt(pod, store, "configMap", storeCM.Name) + "}",
		`"$secrets/member"`, `"$secrets/admin"`, `"$conf/member.acl"`,
	} {
		if !strings.Contains(script, want) {
			t.Errorf("start.sh does not read %s", want)
		}
	}
	for _, key := range []string{"member", "admin"} {
		if secret.StringData[key] == "" || secret.Data[key] != nil {
			t.Errorf("Secret key %s: want a placeholder in stringData", key)
		}
	}

	// The ACL: the user of fleet.store, the keys of fleet.name, the rules
	// agent/fleet documents (and TestFleetACL runs).
	if !strings.Contains(script, fmt.Sprintf("user %s on >", u.User.Username())) {
		t.Errorf("start.sh gives no ACL user %q, the user of fleet.store", u.User.Username())
	}
	acl := strings.Fields(storeCM.Data["member.acl"])
	if want := documentedACL(t, f.Name); !slices.Equal(acl, want) {
		t.Errorf("member.acl %v;\nwant agent/fleet's %v", acl, want)
	}

	// The agents: the Secret's member key as password_file.
	ds := get[*appsv1.DaemonSet](t, objs, "tierlimit")
	dpod := ds.Spec.Template.Spec
	c := dpod.Containers[0]
	dir, file := path.Split(f.PasswordFile)
	var found bool
	for _, v := range dpod.Volumes {
		if v.Secret == nil || v.Secret.SecretName != secret.Name || mountedAt(dpod, c, "secret", secret.Name) != path.Clean(dir) {
			continue
		}
		for _, it := range v.Secret.Items {
			found = found || (it.Key == "member" && it.Path == file)
		}
	}
	if !found {
		t.Errorf("password_file %s is not the Secret %s's member key mounted into the DaemonSet", f.PasswordFile, secret.Name)
	}
	checkSecurityContext(t, c)
	checkHostMounts(t, dpod, c)
	if mountsOf(c)["/etc/tierlimit"].SubPath != "" || mountedAt(dpod, c, "configMap", cm.Name) != "/etc/tierlimit" {
		t.Errorf("the policy is not the tierlimit-policy ConfigMap mounted as a directory at /etc/tierlimit")
	}
	if !slices.Contains(c.Args, "--config=/etc/tierlimit/policy.yaml") {
		t.Errorf("args %v: want the policy file", c.Args)
	}
}

// mountsOf returns c's mounts by path.
func mountsOf(c corev1.Container) map[string]corev1.VolumeMount {
	m := map[string]corev1.VolumeMount{}
	for _, vm := range c.VolumeMounts {
		m[vm.MountPath] = vm
	}
	return m
}

// mountedAt returns where c mounts the pod's volume of the Secret or
// ConfigMap (kind "secret" or "configMap") named name, or "".
func mountedAt(pod corev1.PodSpec, c corev1.Container, kind, name string) string {
	for _, v := range pod.Volumes {
		if kind == "secret" && (v.Secret == nil || v.Secret.SecretName != name) ||
			kind == "configMap" && (v.ConfigMap == nil || v.ConfigMap.Name != name) {
			continue
		}
		for _, m := range c.VolumeMounts {
			if m.Name == v.Name {
				return m.MountPath
			}
		}
	}
	return ""
}

// documentedACL is the member ACL of agent/fleet's package comment for
// fleet name, less its "on >PASSWORD": the rules the store's member.acl
// must give.
func documentedACL(t *testing.T, name string) []string {
	t.Helper()
	src, err := os.ReadFile("../../agent/fleet/fleet.go")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?s)//\tACL SETUSER member on >PASSWORD (.*?)\n//\n`).FindSubmatch(src)
	if m == nil {
		t.Fatal("agent/fleet/fleet.go's package comment gives no ACL SETUSER line")
	}
	rules := strings.Fields(strings.ReplaceAll(string(m[1]), "//", ""))
	for i, r := range rules {
		rules[i] = strings.ReplaceAll(r, "NAME", name)
	}
	return rules
}
