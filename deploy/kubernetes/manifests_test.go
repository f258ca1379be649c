// Package kubernetes holds the tests of the manifests beside it: every
// object decodes strictly (unknown or duplicate fields fail) into the
// Kubernetes API types of the versions pinned in deploy/go.mod, and the
// kustomization builds.
package kubernetes

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/kustomize/api/krusty"
	kusttypes "sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/yaml"
)

// types maps apiVersion/kind to a new value of its Go type.
var types = map[string]func() any{
	"v1/Namespace":                        func() any { return &corev1.Namespace{} },
	"v1/ConfigMap":                        func() any { return &corev1.ConfigMap{} },
	"v1/Service":                          func() any { return &corev1.Service{} },
	"v1/ResourceQuota":                    func() any { return &corev1.ResourceQuota{} },
	"v1/Secret":                           func() any { return &corev1.Secret{} },
	"apps/v1/StatefulSet":                 func() any { return &appsv1.StatefulSet{} },
	"apps/v1/DaemonSet":                   func() any { return &appsv1.DaemonSet{} },
	"monitoring.coreos.com/v1/PodMonitor": func() any { return &monitoringv1.PodMonitor{} },
}

// decode strictly decodes one YAML document into the Go type of its kind.
func decode(doc []byte) (any, error) {
	var tm metav1.TypeMeta
	if err := yaml.Unmarshal(doc, &tm); err != nil {
		return nil, err
	}
	newObj, ok := types[tm.APIVersion+"/"+tm.Kind]
	if !ok {
		return nil, fmt.Errorf("apiVersion %q kind %q: no Go type to check it against", tm.APIVersion, tm.Kind)
	}
	obj := newObj()
	if err := yaml.UnmarshalStrict(doc, obj); err != nil {
		return nil, fmt.Errorf("%s: %w", tm.Kind, err)
	}
	return obj, nil
}

// documents splits a multi-document YAML stream.
func documents(data []byte) [][]byte {
	var docs [][]byte
	for _, d := range bytes.Split(data, []byte("\n---")) {
		if len(bytes.TrimSpace(d)) > 0 {
			docs = append(docs, d)
		}
	}
	return docs
}

func manifestFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob("*.yaml")
	if err != nil || len(files) == 0 {
		t.Fatalf("no manifests: %v", err)
	}
	return slices.DeleteFunc(files, func(f string) bool { return f == "kustomization.yaml" })
}

// TestManifestsDecodeStrictly decodes every object of every file.
func TestManifestsDecodeStrictly(t *testing.T) {
	for _, f := range manifestFiles(t) {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for i, doc := range documents(data) {
			if _, err := decode(doc); err != nil {
				t.Errorf("%s document %d: %v", f, i, err)
			}
		}
	}
}

// TestStrictDecodeCatchesMistakes: a misspelt field, a field at the wrong
// level and a wrong type all fail, so the test above can fail.
func TestStrictDecodeCatchesMistakes(t *testing.T) {
	for _, doc := range []string{
		"apiVersion: apps/v1\nkind: DaemonSet\nspec:\n  template:\n    spec:\n      hostNetwrok: true\n",
		"apiVersion: v1\nkind: Service\nspec:\n  ports:\n    - port: 9713\n      path: /metrics\n",
		"apiVersion: monitoring.coreos.com/v1\nkind: PodMonitor\nspec:\n  podMetricsEndpoints:\n    - port: metrics\n      interval: 15s\n      scrape_interval: 15s\n",
		"apiVersion: v1\nkind: ConfigMap\ndata:\n  iface: [eth0]\n",
		"apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a, name: b}\n",
		"apiVersion: v1\nkind: Pod\n",
	} {
		if _, err := decode([]byte(doc)); err == nil {
			t.Errorf("decoded without error:\n%s", doc)
		}
	}
}

// TestKustomization builds the kustomization (kustomize's own library),
// decodes every object it renders strictly, and checks that it lists every
// manifest of the directory.
func TestKustomization(t *testing.T) {
	data, err := os.ReadFile("kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var k kusttypes.Kustomization
	if err := yaml.UnmarshalStrict(data, &k); err != nil {
		t.Fatalf("kustomization.yaml: %v", err)
	}
	if got, want := slices.Sorted(slices.Values(k.Resources)), manifestFiles(t); !slices.Equal(got, want) {
		t.Errorf("kustomization resources %v, want every manifest %v", got, want)
	}
	kinds := map[string]int{}
	for _, obj := range build(t) {
		m := obj.(metav1.Object)
		kinds[fmt.Sprintf("%T", obj)]++
		if _, isNS := obj.(*corev1.Namespace); !isNS && m.GetNamespace() != "tierlimit" {
			t.Errorf("%T %s: namespace %q, want tierlimit", obj, m.GetName(), m.GetNamespace())
		}
		if ds, ok := obj.(*appsv1.DaemonSet); ok {
			if img := ds.Spec.Template.Spec.Containers[0].Image; !strings.HasPrefix(img, "tierlimit:") {
				t.Errorf("DaemonSet image %q: the kustomization's images entry did not apply", img)
			}
		}
	}
	if len(kinds) != len(types)-len(fleetOnlyKinds) {
		t.Errorf("kustomize build rendered %v, want one or more of each of the %d kinds", kinds, len(types)-len(fleetOnlyKinds))
	}
}

// build runs the kustomization (kustomize's own library) and strictly
// decodes every object it renders.
func build(t *testing.T) []any {
	t.Helper()
	res, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), ".")
	if err != nil {
		t.Fatalf("kustomize build: %v", err)
	}
	out, err := res.AsYaml()
	if err != nil {
		t.Fatal(err)
	}
	var objs []any
	for _, doc := range documents(out) {
		obj, err := decode(doc)
		if err != nil {
			t.Errorf("kustomize build output: %v", err)
			continue
		}
		objs = append(objs, obj)
	}
	return objs
}
