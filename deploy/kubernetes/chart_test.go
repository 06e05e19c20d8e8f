package kubernetes

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/action"
	"helm.sh/helm/v3/pkg/chart/loader"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/lint/support"
	"helm.sh/helm/v3/pkg/releaseutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"

	"github.com/gpu-arbiter/arbiter/config"
)

const (
	chartDir    = "../helm/arbiter"
	releaseName = "arbiter"
	namespace   = "arbiter"
	// minKube is the chart's kubeVersion floor; lint and render use it so
	// that every field the chart sets exists there.
	minKube = "v1.30.0"
)

// wantCaps is the daemon's capability list with default values, exactly.
var wantCaps = []corev1.Capability{"BPF", "PERFMON", "SYS_PTRACE", "SYS_NICE", "KILL", "SYS_RESOURCE"}

func kubeVersion(t *testing.T) *chartutil.KubeVersion {
	t.Helper()
	kv, err := chartutil.ParseKubeVersion(minKube)
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

func values(t *testing.T, file string) map[string]any {
	t.Helper()
	if file == "" {
		return map[string]any{}
	}
	v, err := chartutil.ReadValuesFile(file)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestLint runs Helm's chart checker, strict, as `helm lint --strict`
// does: with the default values and with a values file that changes
// every switch. Nothing at warning level or above may be reported.
func TestLint(t *testing.T) {
	for _, file := range []string{"", "testdata/values-custom.yaml"} {
		t.Run("values="+file, func(t *testing.T) {
			l := action.NewLint()
			l.Strict, l.Namespace, l.KubeVersion = true, namespace, kubeVersion(t)
			res := l.Run([]string{chartDir}, values(t, file))
			for _, err := range res.Errors {
				t.Errorf("lint error: %v", err)
			}
			for _, m := range res.Messages {
				if m.Severity >= support.WarningSev {
					t.Errorf("lint: %s", m)
				} else {
					t.Logf("lint: %s", m)
				}
			}
			if res.TotalChartsLinted != 1 {
				t.Errorf("linted %d charts, want 1", res.TotalChartsLinted)
			}
		})
	}
	// The same check fails a chart given a value its schema refuses.
	l := action.NewLint()
	l.Strict, l.Namespace, l.KubeVersion = true, namespace, kubeVersion(t)
	res := l.Run([]string{chartDir}, map[string]any{"port": 0})
	if len(res.Errors) == 0 {
		t.Error("lint passed port 0")
	}
}

// rendered is the chart rendered as `helm template` renders it.
type rendered struct {
	manifest string
	objects  []runtime.Object
}

func render(t *testing.T, vals map[string]any) rendered {
	t.Helper()
	r, err := renderChart(vals, kubeVersion(t))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func renderChart(vals map[string]any, kv *chartutil.KubeVersion) (rendered, error) {
	chrt, err := loader.Load(chartDir)
	if err != nil {
		return rendered{}, err
	}
	install := action.NewInstall(&action.Configuration{Log: func(string, ...any) {}})
	install.DryRun, install.ClientOnly, install.Replace = true, true, true
	install.ReleaseName, install.Namespace, install.KubeVersion = releaseName, namespace, kv
	rel, err := install.Run(chrt, vals)
	if err != nil {
		return rendered{}, err
	}
	r := rendered{manifest: rel.Manifest}
	files := releaseutil.SplitManifests(rel.Manifest)
	for _, key := range slices.Sorted(maps.Keys(files)) {
		obj, err := decode(files[key])
		if err != nil {
			return rendered{}, err
		}
		r.objects = append(r.objects, obj)
	}
	return r, nil
}

// decode parses one YAML document as a typed Kubernetes object with
// client-go's scheme, or as an unstructured one for kinds the scheme does
// not know (the Prometheus operator's ServiceMonitor).
func decode(doc string) (runtime.Object, error) {
	obj, _, err := scheme.Codecs.UniversalDeserializer().Decode([]byte(doc), nil, nil)
	if err == nil {
		return obj, nil
	}
	if !runtime.IsNotRegisteredError(err) {
		return nil, err
	}
	u := &unstructured.Unstructured{}
	if err := yaml.Unmarshal([]byte(doc), &u.Object); err != nil {
		return nil, err
	}
	return u, nil
}

func find[T runtime.Object](objs []runtime.Object) []T {
	var out []T
	for _, o := range objs {
		if v, ok := o.(T); ok {
			out = append(out, v)
		}
	}
	return out
}

func one[T runtime.Object](t *testing.T, objs []runtime.Object) T {
	t.Helper()
	all := find[T](objs)
	if len(all) != 1 {
		var zero T
		t.Fatalf("rendered %d objects of type %T, want 1", len(all), zero)
	}
	return all[0]
}

func serviceMonitors(objs []runtime.Object) int {
	n := 0
	for _, u := range find[*unstructured.Unstructured](objs) {
		if u.GetKind() == "ServiceMonitor" && u.GetAPIVersion() == "monitoring.coreos.com/v1" {
			n++
		}
	}
	return n
}

func container(t *testing.T, spec corev1.PodSpec, name string) corev1.Container {
	t.Helper()
	for _, c := range append(spec.InitContainers, spec.Containers...) {
		if c.Name == name {
			return c
		}
	}
	t.Fatalf("no container %q", name)
	return corev1.Container{}
}

func mounts(c corev1.Container) map[string]corev1.VolumeMount {
	m := map[string]corev1.VolumeMount{}
	for _, v := range c.VolumeMounts {
		m[v.Name] = v
	}
	return m
}

func volumes(spec corev1.PodSpec) map[string]corev1.Volume {
	m := map[string]corev1.Volume{}
	for _, v := range spec.Volumes {
		m[v.Name] = v
	}
	return m
}

func TestRenderDefaults(t *testing.T) {
	r := render(t, nil)
	for _, u := range find[*unstructured.Unstructured](r.objects) {
		if u.GetKind() != "ServiceMonitor" {
			t.Errorf("unexpected unknown kind %s", u.GetKind())
		}
	}
	if n := serviceMonitors(r.objects); n != 0 {
		t.Errorf("%d ServiceMonitors with serviceMonitor.enabled false", n)
	}
	if strings.Contains(r.manifest, "privileged: true") {
		t.Error("a container is privileged")
	}

	ds := one[*appsv1.DaemonSet](t, r.objects)
	spec := ds.Spec.Template.Spec
	if !spec.HostPID {
		t.Error("hostPID is off: the daemon would see only its own processes")
	}
	if spec.HostNetwork {
		t.Error("hostNetwork is on; nothing needs it")
	}
	checkGPUAffinity(t, spec.Affinity, "nvidia.com/gpu.present", "true")
	if u := ds.Spec.UpdateStrategy; u.Type != appsv1.RollingUpdateDaemonSetStrategyType || u.RollingUpdate == nil ||
		u.RollingUpdate.MaxUnavailable.IntValue() != 1 || u.RollingUpdate.MaxSurge.IntValue() != 0 {
		t.Errorf("update strategy %+v, want rolling with maxUnavailable 1 and maxSurge 0", u)
	}
	if g := spec.TerminationGracePeriodSeconds; g == nil || *g < 30 {
		t.Errorf("termination grace period %v: too short to release every process", g)
	}
	if spec.PriorityClassName != "system-node-critical" {
		t.Errorf("priority class %q", spec.PriorityClassName)
	}

	daemon := container(t, spec, "arbiter")
	recover := container(t, spec, "recover")
	if len(spec.InitContainers) != 1 || recover.Args[0] != "recover" {
		t.Errorf("init containers %v: want the recover step", spec.InitContainers)
	}
	for _, c := range []corev1.Container{daemon, recover} {
		checkSecurity(t, c, wantCaps, false)
	}
	wantArgs := []string{"run", "--config=/etc/arbiter/config.yaml", "--node-name=$(NODE_NAME)",
		"--kubelet-socket=/var/lib/kubelet/pod-resources/kubelet.sock"}
	if !slices.Equal(daemon.Args, wantArgs) {
		t.Errorf("args %q, want %q", daemon.Args, wantArgs)
	}
	checkNodeName(t, daemon)
	checkProbes(t, daemon, 9400, corev1.URISchemeHTTP)
	if daemon.Resources.Requests.Cpu().IsZero() || daemon.Resources.Requests.Memory().IsZero() || daemon.Resources.Limits.Memory().IsZero() {
		t.Errorf("resources %+v: requests and a memory limit are needed", daemon.Resources)
	}

	vols, m := volumes(spec), mounts(daemon)
	checkHostPath(t, vols, m, "bpffs", "/sys/fs/bpf", "/sys/fs/bpf", false)
	if p := m["bpffs"].MountPropagation; p == nil || *p != corev1.MountPropagationHostToContainer {
		t.Errorf("bpffs propagation %v, want HostToContainer", p)
	}
	checkHostPath(t, vols, m, "state", "/var/lib/arbiter", "/var/lib/arbiter", false)
	checkHostPath(t, vols, m, "pod-resources", "/var/lib/kubelet/pod-resources", "/var/lib/kubelet/pod-resources", true)
	rm := mounts(recover)
	if !slices.Equal(recover.Args, []string{"recover"}) {
		t.Errorf("recover args %q", recover.Args)
	}
	for _, name := range []string{"bpffs", "state", "config"} {
		if rm[name].MountPath != m[name].MountPath {
			t.Errorf("recover step mounts %s at %q, the daemon at %q", name, rm[name].MountPath, m[name].MountPath)
		}
	}
	if v := vols["state"].HostPath.Type; v == nil || *v != corev1.HostPathDirectoryOrCreate {
		t.Errorf("state dir type %v", v)
	}
	if m["policy"].MountPath != "/etc/arbiter/policy.d" || vols["policy"].ConfigMap == nil || m["policy"].SubPath != "" {
		t.Errorf("policy mount %+v: the whole ConfigMap must be the directory, or it is never reloaded", m["policy"])
	}
	if m["config"].MountPath != "/etc/arbiter/config.yaml" || vols["config"].ConfigMap == nil {
		t.Errorf("config mount %+v", m["config"])
	}
	for _, v := range spec.Volumes {
		if v.HostPath != nil && (v.HostPath.Path == "/" || v.HostPath.Path == "/proc" || v.HostPath.Path == "/dev") {
			t.Errorf("host path %s mounted: hostPID and the NVIDIA runtime cover it", v.HostPath.Path)
		}
	}

	checkRBAC(t, r.objects, true)
	sa := one[*corev1.ServiceAccount](t, r.objects)
	if spec.ServiceAccountName != sa.Name {
		t.Errorf("pods run as %q, the chart creates %q", spec.ServiceAccountName, sa.Name)
	}

	cms := find[*corev1.ConfigMap](r.objects)
	cfg, pol := configMap(t, cms, "-config"), configMap(t, cms, "-policy")
	var conf map[string]any
	if err := yaml.Unmarshal([]byte(cfg.Data["config.yaml"]), &conf); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"policy": "/etc/arbiter/policy.d", "listen": ":9400", "listen_plain": true, "state_dir": "/var/lib/arbiter",
		"bpffs": "/sys/fs/bpf/arbiter", "log_format": "json", "log_level": "info", "allow_unverified_driver": false}
	if !maps.EqualFunc(conf, want, func(a, b any) bool { return a == b }) {
		t.Errorf("config.yaml = %v, want %v", conf, want)
	}
	checkConfigLoads(t, cfg.Data["config.yaml"])
	if len(pol.Data) != 2 || !strings.Contains(pol.Data["policy.rego"], "package arbiter") || pol.Data["policy_test.rego"] == "" {
		t.Errorf("policy ConfigMap keys %v: want the default policy and its tests", slices.Collect(maps.Keys(pol.Data)))
	}
	if ds.Spec.Template.Annotations["checksum/config"] == "" {
		t.Error("no config checksum: a new configuration would not roll the pods")
	}

	svc := one[*corev1.Service](t, r.objects)
	if len(svc.Spec.Ports) != 1 || svc.Spec.Ports[0].Port != 9400 || svc.Spec.Ports[0].TargetPort.String() != "http" {
		t.Errorf("service ports %+v", svc.Spec.Ports)
	}
}

func TestRenderCustomValues(t *testing.T) {
	r := render(t, values(t, "testdata/values-custom.yaml"))
	if n := serviceMonitors(r.objects); n != 1 {
		t.Fatalf("%d ServiceMonitors with serviceMonitor.enabled true, want 1", n)
	}
	for _, u := range find[*unstructured.Unstructured](r.objects) {
		eps, _, _ := unstructured.NestedSlice(u.Object, "spec", "endpoints")
		if len(eps) != 1 || eps[0].(map[string]any)["path"] != "/metrics" || eps[0].(map[string]any)["port"] != "http" || eps[0].(map[string]any)["interval"] != "30s" {
			t.Errorf("ServiceMonitor endpoints %v", eps)
		}
		// HTTPS (tls.secretName), with the values' TLS configuration.
		if len(eps) == 1 {
			ep := eps[0].(map[string]any)
			tc, _ := ep["tlsConfig"].(map[string]any)
			server, _ := tc["serverName"].(string)
			if ep["scheme"] != "https" || server != "arbiter.arbiter.svc" {
				t.Errorf("ServiceMonitor endpoint scheme %v, tlsConfig %v: want https with the values' tlsConfig", ep["scheme"], tc)
			}
		}
		if u.GetLabels()["release"] != "prometheus" {
			t.Errorf("ServiceMonitor labels %v", u.GetLabels())
		}
	}
	if strings.Contains(r.manifest, "privileged: true") {
		t.Error("a container is privileged")
	}
	ds := one[*appsv1.DaemonSet](t, r.objects)
	spec := ds.Spec.Template.Spec
	checkGPUAffinity(t, spec.Affinity, "example.com/accelerator", "h100")
	daemon := container(t, spec, "arbiter")
	checkSecurity(t, daemon, append(slices.Clone(wantCaps), "SYS_ADMIN"), true)
	if len(spec.InitContainers) != 0 {
		t.Errorf("recoverOnStart false, yet init containers %v", spec.InitContainers)
	}
	if spec.RuntimeClassName == nil || *spec.RuntimeClassName != "nvidia" {
		t.Errorf("runtime class %v", spec.RuntimeClassName)
	}
	if _, ok := volumes(spec)["pod-resources"]; ok {
		t.Error("pod-resources mounted though disabled")
	}
	if !slices.Contains(daemon.Args, "--kubelet-socket=") || !slices.Contains(daemon.Args, "--log-level=debug") {
		t.Errorf("args %q: want the kubelet socket turned off and the extra flag", daemon.Args)
	}
	checkProbes(t, daemon, 9500, corev1.URISchemeHTTPS)
	vols, m := volumes(spec), mounts(daemon)
	if v := vols["tls"]; v.Secret == nil || v.Secret.SecretName != "arbiter-tls" || m["tls"].MountPath != "/etc/arbiter/tls" || !m["tls"].ReadOnly || m["tls"].SubPath != "" {
		t.Errorf("TLS volume %+v, mount %+v: want the Secret whole, read-only, at /etc/arbiter/tls", v, m["tls"])
	}
	checkRBAC(t, r.objects, false)
	if len(find[*corev1.ServiceAccount](r.objects)) != 0 || spec.ServiceAccountName != "gpu-readers" {
		t.Errorf("service account %q", spec.ServiceAccountName)
	}
	pol := configMap(t, find[*corev1.ConfigMap](r.objects), "-policy")
	if len(pol.Data) != 2 || !strings.Contains(pol.Data["policy.rego"], `input.process.pod.namespace == "serving"`) || pol.Data["data.json"] == "" {
		t.Errorf("policy ConfigMap %v: want the policies of the values", pol.Data)
	}
	cfg := configMap(t, find[*corev1.ConfigMap](r.objects), "-config")
	for _, line := range []string{"listen: \":9500\"", "tls_cert: /etc/arbiter/tls/tls.crt", "tls_key: /etc/arbiter/tls/tls.key",
		"state_dir: /var/lib/arbiter-test", "bpffs: /sys/fs/bpf/arbiter-test", "log_level: debug", "allow_unverified_driver: true"} {
		if !strings.Contains(cfg.Data["config.yaml"], line) {
			t.Errorf("config.yaml lacks %q:\n%s", line, cfg.Data["config.yaml"])
		}
	}
	if strings.Contains(cfg.Data["config.yaml"], "listen_plain") {
		t.Errorf("listen_plain beside TLS:\n%s", cfg.Data["config.yaml"])
	}
	checkConfigLoads(t, cfg.Data["config.yaml"])
}

// TestRenderBundle: with a bundle server the daemon's configuration names
// it and the keys mounted from their Secrets, with no policy directory;
// the token's Secret is a whole volume, so that a rotation reaches the
// pod, and the configuration loads as the daemon would load it.
func TestRenderBundle(t *testing.T) {
	var vals map[string]any
	if err := yaml.Unmarshal([]byte(`bundle:
  url: https://bundles.example.com/arbiter/canary.tar.gz
  publicKey: {secretName: arbiter-bundle-key, key: bundle.pem}
  keyAlg: ES256
  keyID: prod
  scope: ""
  token: {secretName: arbiter-bundle-token, key: token}
  poll: 30s
  timeout: 10s
  maxBytes: 8MiB
`), &vals); err != nil {
		t.Fatal(err)
	}
	l := action.NewLint()
	l.Strict, l.Namespace, l.KubeVersion = true, namespace, kubeVersion(t)
	res := l.Run([]string{chartDir}, vals)
	for _, m := range res.Messages {
		if m.Severity >= support.WarningSev {
			t.Errorf("lint: %s", m)
		}
	}
	r := render(t, vals)
	cms := find[*corev1.ConfigMap](r.objects)
	for _, cm := range cms {
		if strings.HasSuffix(cm.Name, "-policy") {
			t.Errorf("a policy ConfigMap %s beside a bundle server", cm.Name)
		}
	}
	text := configMap(t, cms, "-config").Data["config.yaml"]
	var conf map[string]any
	if err := yaml.Unmarshal([]byte(text), &conf); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"policy": "", "bundle_url": "https://bundles.example.com/arbiter/canary.tar.gz",
		"bundle_public_key": "/etc/arbiter/bundle-key/bundle.pem", "bundle_key_alg": "ES256", "bundle_key_id": "prod",
		"bundle_token_file": "/etc/arbiter/bundle-token/token", "bundle_poll": "30s", "bundle_timeout": "10s", "bundle_max_bytes": "8MiB"}
	for k, v := range want {
		if conf[k] != v {
			t.Errorf("config.yaml %s = %v, want %v\n%s", k, conf[k], v, text)
		}
	}
	if _, ok := conf["bundle_scope"]; ok {
		t.Errorf("an empty scope written:\n%s", text)
	}
	checkConfigLoads(t, text)

	spec := one[*appsv1.DaemonSet](t, r.objects).Spec.Template.Spec
	vols, m := volumes(spec), mounts(container(t, spec, "arbiter"))
	if _, ok := m["policy"]; ok {
		t.Error("the policy directory is mounted beside a bundle server")
	}
	for name, secret := range map[string]string{"bundle-key": "arbiter-bundle-key", "bundle-token": "arbiter-bundle-token"} {
		if v := vols[name]; v.Secret == nil || v.Secret.SecretName != secret || !m[name].ReadOnly || m[name].SubPath != "" {
			t.Errorf("volume %s %+v, mount %+v", name, v, m[name])
		}
	}
	if m["bundle-key"].MountPath != "/etc/arbiter/bundle-key" || m["bundle-token"].MountPath != "/etc/arbiter/bundle-token" {
		t.Errorf("mounts %+v", m)
	}
}

// TestBadValuesAreRefused: values the schema or the templates refuse fail
// with an error that names the value.
func TestBadValuesAreRefused(t *testing.T) {
	tests := []struct {
		name string
		vals string
		want string
	}{
		{"service monitor without service", "serviceMonitor: {enabled: true}\nservice: {enabled: false}", "serviceMonitor.enabled needs service.enabled"},
		{"pin path outside bpffs", "bpffs: {hostPath: /sys/fs/bpf, pinPath: /run/arbiter}", "must be under bpffs.hostPath"},
		{"unknown capability", "capabilities: {add: [BPF, NET_ADMIN], sysAdmin: false}", "/capabilities/add/1"},
		{"a setting the chart owns", "config: {policy: /tmp/p}", "policy"},
		{"surge", "updateStrategy: {type: RollingUpdate, rollingUpdate: {maxUnavailable: 1, maxSurge: 1}}", "maxSurge"},
		{"relative state dir", "stateDir: var/lib/arbiter", "stateDir"},
		{"policy file name", "policies: {\"../x.rego\": \"package x\"}", "../x.rego"},
		{"bundle URL", "bundle: {url: ftp://b/x.tar.gz, publicKey: {secretName: '', key: k}, keyAlg: '', keyID: default, scope: '', token: {secretName: '', key: t}, poll: 1m, timeout: 30s, maxBytes: 16MiB}", "/bundle/url"},
		{"bundle settings in config", "config: {bundle_url: https://b/x.tar.gz}", "bundle_url"},
		{"TLS files in config", "config: {tls_cert: /etc/arbiter/tls/tls.crt}", "tls_cert"},
		{"TLS Secret misspelt", "tls: {secret: arbiter-tls}", "/tls"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var vals map[string]any
			if err := yaml.Unmarshal([]byte(tc.vals), &vals); err != nil {
				t.Fatal(err)
			}
			_, err := renderChart(vals, kubeVersion(t))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("render error %v, want one naming %q", err, tc.want)
			}
		})
	}
}

func checkGPUAffinity(t *testing.T, a *corev1.Affinity, key, value string) {
	t.Helper()
	if a == nil || a.NodeAffinity == nil || a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		t.Fatal("no required node affinity: the daemon would run on nodes without GPUs")
	}
	terms := a.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution.NodeSelectorTerms
	if len(terms) != 1 || len(terms[0].MatchExpressions) != 1 {
		t.Fatalf("node selector terms %+v", terms)
	}
	e := terms[0].MatchExpressions[0]
	if e.Key != key || e.Operator != corev1.NodeSelectorOpIn || !slices.Contains(e.Values, value) {
		t.Errorf("node affinity %+v, want %s In [%s]", e, key, value)
	}
}

func checkSecurity(t *testing.T, c corev1.Container, caps []corev1.Capability, sysAdmin bool) {
	t.Helper()
	sc := c.SecurityContext
	if sc == nil || sc.Capabilities == nil {
		t.Fatalf("%s: no security context", c.Name)
	}
	if sc.Privileged == nil || *sc.Privileged {
		t.Errorf("%s: privileged %v, want false", c.Name, sc.Privileged)
	}
	if !slices.Equal(sc.Capabilities.Add, caps) {
		t.Errorf("%s: capabilities %v, want exactly %v", c.Name, sc.Capabilities.Add, caps)
	}
	if !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Errorf("%s: drops %v, want ALL", c.Name, sc.Capabilities.Drop)
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Errorf("%s: writable root file system", c.Name)
	}
	// Kubernetes refuses allowPrivilegeEscalation false next to SYS_ADMIN.
	if ape := sc.AllowPrivilegeEscalation; ape == nil || *ape != sysAdmin {
		t.Errorf("%s: allowPrivilegeEscalation %v with sysAdmin %v", c.Name, ape, sysAdmin)
	}
	if sysAdmin != (sc.AppArmorProfile != nil && sc.AppArmorProfile.Type == corev1.AppArmorProfileTypeUnconfined) {
		t.Errorf("%s: AppArmor %v with sysAdmin %v", c.Name, sc.AppArmorProfile, sysAdmin)
	}
	if sc.SeccompProfile == nil {
		t.Errorf("%s: no seccomp profile", c.Name)
	}
}

func checkNodeName(t *testing.T, c corev1.Container) {
	t.Helper()
	for _, e := range c.Env {
		if e.Name == "NODE_NAME" {
			if e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != "spec.nodeName" {
				t.Errorf("NODE_NAME %+v, want the downward API's spec.nodeName", e)
			}
			return
		}
	}
	t.Error("no NODE_NAME")
}

func checkProbes(t *testing.T, c corev1.Container, port int32, scheme corev1.URIScheme) {
	t.Helper()
	if len(c.Ports) != 1 || c.Ports[0].Name != "http" || c.Ports[0].ContainerPort != port {
		t.Errorf("ports %+v, want http %d", c.Ports, port)
	}
	for path, p := range map[string]*corev1.Probe{"/healthz": c.LivenessProbe, "/readyz": c.ReadinessProbe} {
		if p == nil || p.HTTPGet == nil || p.HTTPGet.Path != path || p.HTTPGet.Port.String() != "http" || p.HTTPGet.Scheme != scheme {
			t.Errorf("probe for %s: %+v, want %s", path, p, scheme)
		}
	}
}

// checkConfigLoads: the daemon loads the chart's config.yaml as it is.
func checkConfigLoads(t *testing.T, text string) {
	t.Helper()
	cfg, err := config.Parse("config.yaml", []byte(text))
	if err == nil {
		err = cfg.Validate()
	}
	if err != nil {
		t.Fatalf("the daemon refuses the chart's config.yaml: %v\n%s", err, text)
	}
}

func checkHostPath(t *testing.T, vols map[string]corev1.Volume, m map[string]corev1.VolumeMount, name, host, at string, readOnly bool) {
	t.Helper()
	v, ok := vols[name]
	if !ok || v.HostPath == nil || v.HostPath.Path != host {
		t.Errorf("volume %s = %+v, want host path %s", name, v, host)
	}
	if m[name].MountPath != at || m[name].ReadOnly != readOnly {
		t.Errorf("mount %s = %+v, want %s read-only %v", name, m[name], at, readOnly)
	}
}

// checkRBAC: one ClusterRole granting get, list and watch on pods and
// nothing else, bound to the chart's service account; none when off.
func checkRBAC(t *testing.T, objs []runtime.Object, on bool) {
	t.Helper()
	roles, bindings := find[*rbacv1.ClusterRole](objs), find[*rbacv1.ClusterRoleBinding](objs)
	if len(find[*rbacv1.Role](objs))+len(find[*rbacv1.RoleBinding](objs)) != 0 {
		t.Error("namespaced roles rendered")
	}
	if !on {
		if len(roles)+len(bindings) != 0 {
			t.Error("RBAC rendered with rbac.create false")
		}
		return
	}
	if len(roles) != 1 || len(bindings) != 1 {
		t.Fatalf("%d ClusterRoles, %d bindings", len(roles), len(bindings))
	}
	rules := roles[0].Rules
	if len(rules) != 1 || !slices.Equal(rules[0].APIGroups, []string{""}) || !slices.Equal(rules[0].Resources, []string{"pods"}) ||
		!slices.Equal(rules[0].Verbs, []string{"get", "list", "watch"}) || len(rules[0].ResourceNames)+len(rules[0].NonResourceURLs) != 0 {
		t.Errorf("rules %+v, want get, list and watch on pods only", rules)
	}
	b := bindings[0]
	if b.RoleRef.Kind != "ClusterRole" || b.RoleRef.Name != roles[0].Name || len(b.Subjects) != 1 ||
		b.Subjects[0].Kind != "ServiceAccount" || b.Subjects[0].Namespace != namespace {
		t.Errorf("binding %+v", b)
	}
}

func configMap(t *testing.T, cms []*corev1.ConfigMap, suffix string) *corev1.ConfigMap {
	t.Helper()
	for _, c := range cms {
		if strings.HasSuffix(c.Name, suffix) {
			return c
		}
	}
	t.Fatalf("no ConfigMap named *%s", suffix)
	return nil
}
