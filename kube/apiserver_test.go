package kube

import (
	"context"
	"errors"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/rest"
	k8stesting "k8s.io/client-go/testing"
)

const node = "gpu-node-1"

func pod(ns, name, uid, nodeName string, labels map[string]string, containers ...corev1.ContainerStatus) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, UID: types.UID(uid), Labels: labels,
			Annotations: map[string]string{"big": strings.Repeat("x", 1000)}},
		Spec:   corev1.PodSpec{NodeName: nodeName, Containers: []corev1.Container{{Name: "c", Image: "i"}}},
		Status: corev1.PodStatus{ContainerStatuses: containers},
	}
}

func clientOf(c kubernetes.Interface) func() (kubernetes.Interface, error) {
	return func() (kubernetes.Interface, error) { return c, nil }
}

func TestAPIServerAnswersLabelsAndContainer(t *testing.T) {
	otherUID := "11111111-2222-4333-8444-555555555555"
	client := fake.NewClientset(
		pod("serving", "llm-0", testUID, node, map[string]string{"app": "llm", "arbiter.io/class": "latency-critical"},
			corev1.ContainerStatus{Name: "server", ContainerID: "containerd://" + testCID},
			corev1.ContainerStatus{Name: "sidecar", ContainerID: "containerd://" + strings.Repeat("f", 64)}),
		// The fake clientset ignores field selectors; a real API server
		// would not have sent this pod of another node.
		pod("batch", "elsewhere", otherUID, "gpu-node-2", map[string]string{"app": "x"}),
	)
	var selectors sync.Map
	client.PrependReactor("list", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		selectors.Store(a.(k8stesting.ListAction).GetListRestrictions().Fields.String(), true)
		return false, nil, nil
	})
	r, ch := startResolver(t, Options{NodeName: node, Client: clientOf(client)})
	waitFor(t, "api server ok", func() bool { return r.Status().APIServer.State == StateOK })
	if _, ok := selectors.Load("spec.nodeName=" + node); !ok {
		t.Error("the pod list was not restricted to this node with spec.nodeName")
	}

	systemd := "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod" + strings.ReplaceAll(testUID, "-", "_") + ".slice/cri-containerd-" + testCID + ".scope"
	p, src, err := r.Pod(100, systemd, nil)
	if err != nil || src != SourceAPIServer || p.Namespace != "serving" || p.Name != "llm-0" || p.Container != "server" ||
		p.UID != testUID || p.Labels["arbiter.io/class"] != "latency-critical" || len(p.Labels) != 2 {
		t.Fatalf("Pod = %+v from %s, %v", p, src, err)
	}
	p.Labels["app"] = "changed by the caller"
	if p2, _, _ := r.Pod(100, systemd, nil); p2.Labels["app"] != "llm" {
		t.Error("the caller's labels share the cache's map")
	}
	// The pod's own cgroup (no container below it) names no container.
	if p, _, _ := r.Pod(100, "/kubepods/burstable/pod"+testUID, nil); p.Name != "llm-0" || p.Container != "" {
		t.Errorf("pod cgroup: %+v", p)
	}
	if _, src, _ := r.Pod(100, "/kubepods/burstable/pod"+otherUID+"/"+testCID, nil); src != SourceCgroup {
		t.Errorf("another node's pod answered from %s", src)
	}
	if p, ok := r.ByUID(testUID); !ok || p.Name != "llm-0" || p.Labels["app"] != "llm" {
		t.Errorf("ByUID = %+v, %v", p, ok)
	}
	if _, ok := r.ByUID(otherUID); ok {
		t.Error("ByUID answered another node's pod")
	}
	if h := r.Status().APIServer; h.Pods != 2 || !strings.Contains(h.Detail, node) {
		t.Errorf("health %+v", h)
	}

	// Label changes arrive through the watch.
	ctx := context.Background()
	cur, _ := client.CoreV1().Pods("serving").Get(ctx, "llm-0", metav1.GetOptions{})
	cur.Labels["arbiter.io/class"] = "best-effort"
	if _, err := client.CoreV1().Pods("serving").Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the new label", func() bool {
		p, _ := r.ByUID(testUID)
		return p.Labels["arbiter.io/class"] == "best-effort"
	})
	// A deleted pod is forgotten.
	if err := client.CoreV1().Pods("serving").Delete(ctx, "llm-0", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the deletion", func() bool { _, ok := r.ByUID(testUID); return !ok })
	if got := ch.of(SourceAPIServer); len(got) != 1 || got[0].State != StateOK {
		t.Errorf("changes %v, want one ok", got)
	}
}

func TestAPIServerStaticPodByMirrorHash(t *testing.T) {
	mirror := pod("kube-system", "dcgm-gpu-node-1", "aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee", node, map[string]string{"tier": "node"})
	mirror.Annotations["kubernetes.io/config.mirror"] = staticUID
	r, _ := startResolver(t, Options{NodeName: node, Client: clientOf(fake.NewClientset(mirror))})
	waitFor(t, "api server ok", func() bool { return r.Status().APIServer.State == StateOK })
	p, src, _ := r.Pod(3, "/kubepods/burstable/pod"+staticUID+"/"+testCID, nil)
	if src != SourceAPIServer || p.UID != staticUID || p.Name != "dcgm-gpu-node-1" || p.Labels["tier"] != "node" {
		t.Errorf("static pod = %+v from %s", p, src)
	}
}

func TestAPIServerPreferredOverPodResources(t *testing.T) {
	sock := filepath.Join(socketDir(t), "kubelet.sock")
	k := &kubelet{}
	k.set(0, podRes("stale-ns", "stale-name", ctr("x", dev("nvidia.com/gpu", gpuA))))
	serve(t, sock, k)
	client := fake.NewClientset(pod("serving", "llm-0", testUID, node, map[string]string{"app": "llm"}))
	r, _ := startResolver(t, Options{NodeName: node, Client: clientOf(client), PodResourcesSocket: sock})
	waitFor(t, "both ok", func() bool {
		s := r.Status()
		return s.APIServer.State == StateOK && s.PodResources.State == StateOK
	})
	if p, src, _ := r.Pod(3, podCgroup, []string{gpuA}); src != SourceAPIServer || p.Name != "llm-0" {
		t.Errorf("Pod = %+v from %s; want the API server's answer", p, src)
	}
	// A pod the API server has not listed yet falls to the kubelet's.
	newUID := "99999999-8888-4777-8666-555555555555"
	if p, src, _ := r.Pod(3, "/kubepods/pod"+newUID+"/"+testCID, []string{gpuA}); src != SourcePodResources || p.Name != "stale-name" || p.UID != newUID {
		t.Errorf("Pod = %+v from %s; want the kubelet's answer with the cgroup's UID", p, src)
	}
	if s := r.Status().String(); !strings.Contains(s, "api server: ok") || !strings.Contains(s, "kubelet pod-resources: ok") {
		t.Errorf("status line %q", s)
	}
}

func TestAPIServerForbiddenThenGranted(t *testing.T) {
	client := fake.NewClientset(pod("serving", "llm-0", testUID, node, nil))
	var forbid atomic.Bool
	forbid.Store(true)
	deny := func(a k8stesting.Action) (bool, runtime.Object, error) {
		if !forbid.Load() {
			return false, nil, nil
		}
		return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "pods"}, "",
			errors.New(`User "system:serviceaccount:arbiter:arbiter" cannot `+a.GetVerb()+` resource "pods" at the cluster scope`))
	}
	client.PrependReactor("list", "pods", deny)
	client.PrependWatchReactor("pods", func(a k8stesting.Action) (bool, watch.Interface, error) {
		if forbid.Load() {
			_, _, err := deny(a)
			return true, nil, err
		}
		return false, nil, nil
	})
	r, ch := startResolver(t, Options{NodeName: node, Client: clientOf(client)})
	waitFor(t, "degraded", func() bool { return r.Status().APIServer.State == StateDegraded })
	if d := r.Status().APIServer.Detail; !strings.Contains(d, "RBAC forbids") || !strings.Contains(d, "get, list and watch on pods") {
		t.Errorf("detail %q does not say how to fix it", d)
	}
	if p, src, _ := r.Pod(3, podCgroup, nil); src != SourceCgroup || p.UID != testUID {
		t.Errorf("Pod = %+v from %s while forbidden", p, src)
	}
	time.Sleep(2 * time.Second) // the informer retries with backoff
	if got := ch.of(SourceAPIServer); len(got) != 1 {
		t.Errorf("reported %d times while forbidden, want once: %v", len(got), got)
	}
	forbid.Store(false)
	waitFor(t, "granted", func() bool { return r.Status().APIServer.State == StateOK })
	if _, src, _ := r.Pod(3, podCgroup, nil); src != SourceAPIServer {
		t.Errorf("after the grant, answered from %s", src)
	}
	if got := ch.of(SourceAPIServer); len(got) != 2 || got[1].State != StateOK {
		t.Errorf("changes %v, want degraded then ok", got)
	}
}

func TestAPIServerDown(t *testing.T) {
	// A real client for an API server that is not there.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	client, err := kubernetes.NewForConfig(&rest.Config{Host: "http://" + addr, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	r, ch := startResolver(t, Options{NodeName: node, Client: clientOf(client)})
	waitFor(t, "degraded", func() bool { return r.Status().APIServer.State == StateDegraded })
	if d := r.Status().APIServer.Detail; !strings.Contains(d, "API server unreachable") || !strings.Contains(d, "connection refused") || strings.Contains(d, "fieldSelector") {
		t.Errorf("detail %q", d)
	}
	if _, src, _ := r.Pod(3, podCgroup, nil); src != SourceCgroup {
		t.Errorf("answered from %s with the API server down", src)
	}
	time.Sleep(2 * time.Second) // retries
	if got := ch.of(SourceAPIServer); len(got) != 1 {
		t.Errorf("reported %d times, want once: %v", len(got), got)
	}
}

func TestAPIServerNotInCluster(t *testing.T) {
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	t.Setenv("KUBERNETES_SERVICE_PORT", "")
	r, _ := startResolver(t, Options{NodeName: node, Client: InClusterClient})
	waitFor(t, "degraded", func() bool { return r.Status().APIServer.State == StateDegraded })
	if d := r.Status().APIServer.Detail; !strings.Contains(d, "no in-cluster configuration") || !strings.Contains(d, "ServiceAccount") {
		t.Errorf("detail %q", d)
	}
}

func TestAPIServerWithoutNodeName(t *testing.T) {
	r, _ := startResolver(t, Options{Client: clientOf(fake.NewClientset())})
	waitFor(t, "degraded", func() bool { return r.Status().APIServer.State == StateDegraded })
	if d := r.Status().APIServer.Detail; !strings.Contains(d, "--node-name") {
		t.Errorf("detail %q", d)
	}
}

func TestDisabledSources(t *testing.T) {
	r, ch := startResolver(t, Options{})
	s := r.Status()
	if s.APIServer.State != StateDisabled || s.PodResources.State != StateDisabled || len(ch.of(SourceAPIServer)) != 1 || len(ch.of(SourcePodResources)) != 1 {
		t.Errorf("status %v, changes %v", s, ch.all)
	}
	if !strings.Contains(s.String(), "cgroup path only") {
		t.Errorf("status line %q", s)
	}
	if p, src, err := r.Pod(1, podCgroup, []string{gpuA}); err != nil || src != SourceCgroup || p.UID != testUID {
		t.Errorf("Pod = %+v from %s, %v", p, src, err)
	}
}

func TestPodBadArguments(t *testing.T) {
	r := New(Options{})
	if _, _, err := r.Pod(0, podCgroup, nil); err == nil || !strings.Contains(err.Error(), "pid 0") {
		t.Errorf("pid 0: %v", err)
	}
	if _, _, err := r.Pod(12, "", nil); err == nil || !strings.Contains(err.Error(), "/proc/12/cgroup") {
		t.Errorf("empty cgroup: %v", err)
	}
	if _, ok := r.ByUID(testUID); ok {
		t.Error("ByUID answered before Start")
	}
}

func TestSourceAndStateNames(t *testing.T) {
	for want, s := range map[string]string{
		"none": SourceNone.String(), "cgroup": SourceCgroup.String(), "kubelet pod-resources": SourcePodResources.String(),
		"api server": SourceAPIServer.String(), "Source(9)": Source(9).String(),
		"starting": StateStarting.String(), "ok": StateOK.String(), "degraded": StateDegraded.String(),
		"disabled": StateDisabled.String(), "State(9)": State(9).String(),
	} {
		if s != want {
			t.Errorf("got %q, want %q", s, want)
		}
	}
}
