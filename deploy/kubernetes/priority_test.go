package kubernetes

import (
	"slices"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// maxNodes is Kubernetes' largest supported cluster: one agent per node.
const maxNodes = 5000

// TestPriorityClassQuota: on a cluster that limits the consumption of a
// priority class (GKE limits system-node-critical and
// system-cluster-critical outside kube-system; any cluster can, through
// the ResourceQuota admission plugin's limitedResources), the quota
// admission creates a pod of that class only in a namespace with a
// ResourceQuota whose scope selector matches it, and only while the quota
// has room. The rendered kustomization must hold such a quota, in the
// DaemonSet's namespace, with room for an agent on every node and no
// limit on anything else the pod uses.
func TestPriorityClassQuota(t *testing.T) {
	var ds *appsv1.DaemonSet
	var quotas []*corev1.ResourceQuota
	for _, obj := range build(t) {
		switch o := obj.(type) {
		case *appsv1.DaemonSet:
			ds = o
		case *corev1.ResourceQuota:
			quotas = append(quotas, o)
		}
	}
	if ds == nil {
		t.Fatal("no DaemonSet rendered")
	}
	class := ds.Spec.Template.Spec.PriorityClassName
	if class != "system-node-critical" {
		t.Fatalf("priorityClassName %q, want system-node-critical (the kubelet neither evicts nor preempts it first)", class)
	}
	for _, q := range quotas {
		if q.Namespace != ds.Namespace || !scopeMatches(q.Spec, class) {
			continue
		}
		if pods := q.Spec.Hard[corev1.ResourcePods]; pods.Cmp(*resource.NewQuantity(maxNodes, resource.DecimalSI)) < 0 {
			t.Errorf("ResourceQuota %s: pods %s, want room for one agent on each of %d nodes", q.Name, pods.String(), maxNodes)
		}
		for r := range q.Spec.Hard {
			if r != corev1.ResourcePods {
				t.Errorf("ResourceQuota %s limits %s too: an agent could be refused on a large cluster", q.Name, r)
			}
		}
		return
	}
	t.Errorf("no ResourceQuota in namespace %q whose scope selector matches priority class %s (%d quotas): "+
		"where the class's consumption is limited, no pod is created", ds.Namespace, class, len(quotas))
}

// scopeMatches says whether the quota allows pods of priority class
// class where the class's consumption is limited: a PriorityClass scope
// selector "In" naming it, the form the quota admission compares with the
// limited scope (and the one GKE's and Kubernetes' documentation give), and
// nothing else in its scope that a pod could fail.
func scopeMatches(spec corev1.ResourceQuotaSpec, class string) bool {
	if len(spec.Scopes) > 0 || spec.ScopeSelector == nil || len(spec.ScopeSelector.MatchExpressions) != 1 {
		return false
	}
	e := spec.ScopeSelector.MatchExpressions[0]
	return e.ScopeName == corev1.ResourceQuotaScopePriorityClass && e.Operator == corev1.ScopeSelectorOpIn &&
		slices.Contains(e.Values, class)
}
