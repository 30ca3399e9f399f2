package chart

import (
	"encoding/json"
	"os"
	"path/filepath"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"

	v1alpha1 "github.com/guestbackup/guestbackup/api/v1alpha1"
	"github.com/guestbackup/guestbackup/internal/promexpr"
	"github.com/guestbackup/guestbackup/pkg/kopiaserver"
)

// strictly decodes a rendered object into the Prometheus Operator's type,
// refusing any field the operator's API does not have.
func strictly[T any](o *unstructured.Unstructured) *T {
	GinkgoHelper()
	data, err := json.Marshal(o.Object)
	Expect(err).NotTo(HaveOccurred())
	out := new(T)
	Expect(yaml.UnmarshalStrict(data, out)).To(Succeed(), "%s %s has fields the Prometheus Operator does not know", o.GetKind(), o.GetName())
	return out
}

var _ = Describe("The chart's monitoring", func() {
	It("renders nothing of it by default", func() {
		r := render("gb-default", "default.yaml")
		for _, kind := range []string{"ServiceMonitor", "PodMonitor", "PrometheusRule"} {
			Expect(r.ofKind(kind)).To(BeEmpty(), kind)
		}
		for _, cm := range r.ofKind("ConfigMap") {
			Expect(cm.GetLabels()).NotTo(HaveKey("grafana_dashboard"))
		}
	})

	It("lints strictly with every part enabled", func() {
		out, err := helm("lint", "--strict", chartDir, "--values", filepath.Join("testdata", "monitoring.yaml"))
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(out).To(ContainSubstring("0 chart(s) failed"))
	})

	It("refuses a ServiceMonitor without the metrics Services it scrapes", func() {
		_, err := helm("template", release, chartDir, "--set", "monitoring.serviceMonitor.enabled=true", "--set", "metrics.service.enabled=false")
		Expect(err).To(MatchError(ContainSubstring("needs metrics.service.enabled")))
	})

	Describe("with every part enabled", Ordered, func() {
		const namespace = "gb-monitoring"
		var r rendered
		BeforeAll(func() { r = render(namespace, "monitoring.yaml") })

		It("scrapes the controller's and the webhook's metrics Services, and only them", func() {
			sm := strictly[monitoringv1.ServiceMonitor](r.find("ServiceMonitor", release))
			Expect(sm.Labels).To(HaveKeyWithValue("release", "kube-prometheus-stack"))
			Expect(sm.Spec.NamespaceSelector.MatchNames).To(ConsistOf(namespace))
			selector, err := metav1.LabelSelectorAsSelector(&sm.Spec.Selector)
			Expect(err).NotTo(HaveOccurred())
			var selected []string
			for _, o := range r.ofKind("Service") {
				if selector.Matches(labels.Set(o.GetLabels())) {
					selected = append(selected, o.GetName())
					svc := as[corev1.Service](o)
					Expect(svc.Spec.Ports).To(ContainElement(HaveField("Name", "metrics")), svc.Name)
				}
			}
			Expect(selected).To(ConsistOf(release+"-controller-metrics", release+"-webhook-metrics"))
			Expect(sm.Spec.Endpoints).To(HaveLen(1))
			Expect(sm.Spec.Endpoints[0].Port).To(Equal("metrics"))
			Expect(sm.Spec.Endpoints[0].HonorLabels).To(BeTrue(), "the controller's namespace label is the BSLS's")
			Expect(string(sm.Spec.Endpoints[0].Interval)).To(Equal("30s"))
		})

		It("scrapes the server pods the controller writes, on ports their containers declare", func() {
			pm := strictly[monitoringv1.PodMonitor](r.find("PodMonitor", release+"-servers"))
			Expect(pm.Spec.NamespaceSelector.Any).To(BeTrue(), "BSLSs live in any namespace")
			// The server pod as pkg/kopiaserver writes it.
			b := &v1alpha1.BackupStorageLocationServer{
				ObjectMeta: metav1.ObjectMeta{Name: "main", Namespace: "backup", UID: "u"},
				Spec:       v1alpha1.BackupStorageLocationServerSpec{Storage: v1alpha1.StorageSpec{Filesystem: &v1alpha1.FilesystemStorage{}}, Replicas: ptr.To[int32](1)},
			}
			d, err := kopiaserver.Deployment(b, kopiaserver.WorkloadInputs{Image: "guestbackup:test"})
			Expect(err).NotTo(HaveOccurred())
			selector, err := metav1.LabelSelectorAsSelector(&pm.Spec.Selector)
			Expect(err).NotTo(HaveOccurred())
			Expect(selector.Matches(labels.Set(d.Spec.Template.Labels))).To(BeTrue(), "selects the server pod's labels %v", d.Spec.Template.Labels)
			ports := map[string]bool{}
			for _, c := range d.Spec.Template.Spec.Containers {
				for _, p := range c.Ports {
					ports[p.Name] = true
				}
			}
			Expect(pm.Spec.PodMetricsEndpoints).To(HaveLen(2))
			for _, e := range pm.Spec.PodMetricsEndpoints {
				Expect(e.Port).NotTo(BeNil())
				Expect(ports).To(HaveKey(*e.Port), "the server pod has no port %s", *e.Port)
				// The BSLS's name, from the pod label the controller sets.
				Expect(e.RelabelConfigs).To(ContainElement(And(
					HaveField("SourceLabels", ConsistOf(monitoringv1.LabelName("__meta_kubernetes_pod_label_guestbackup_io_bsls"))),
					HaveField("TargetLabel", "bsls"))))
			}
			Expect(d.Spec.Template.Labels).To(HaveKeyWithValue(kopiaserver.LabelBSLS, "main"))
		})

		It("ships the alerts file as its PrometheusRule, every expression PromQL", func() {
			pr := strictly[monitoringv1.PrometheusRule](r.find("PrometheusRule", release))
			data, err := os.ReadFile(filepath.Join(chartDir, "files", "monitoring", "alerts.yaml"))
			Expect(err).NotTo(HaveOccurred())
			var file monitoringv1.PrometheusRuleSpec
			Expect(yaml.UnmarshalStrict(data, &file)).To(Succeed())
			Expect(pr.Spec).To(Equal(file))
			var alerts []string
			for _, g := range pr.Spec.Groups {
				for _, rule := range g.Rules {
					alerts = append(alerts, rule.Alert)
					_, err := promexpr.MetricNames(rule.Expr.String())
					Expect(err).NotTo(HaveOccurred(), rule.Alert)
					Expect(rule.Annotations).To(HaveKey("summary"), rule.Alert)
				}
			}
			Expect(alerts).To(ContainElements("GuestbackupMaintenanceFailing", "GuestbackupBackupStale", "GuestbackupRepositoryGrowing",
				"GuestbackupServerUnavailable", "GuestbackupUsersNotSynced", "GuestbackupStorageLow", "GuestbackupStorageFull"))
		})

		It("ships the dashboard as a ConfigMap Grafana's sidecar discovers", func() {
			cm := as[corev1.ConfigMap](r.find("ConfigMap", release+"-dashboard"))
			Expect(cm.Namespace).To(Equal("monitoring"))
			Expect(cm.Labels).To(HaveKeyWithValue("grafana_dashboard", "1"))
			Expect(cm.Annotations).To(HaveKeyWithValue("grafana_folder", "Backup"))
			Expect(cm.Data).To(HaveLen(1))
			data, err := os.ReadFile(filepath.Join(chartDir, "files", "monitoring", "dashboard.json"))
			Expect(err).NotTo(HaveOccurred())
			Expect(cm.Data).To(HaveKeyWithValue("guestbackup-bsls.json", string(data)))
			var d map[string]any
			Expect(json.Unmarshal(data, &d)).To(Succeed())
			Expect(d).To(HaveKeyWithValue("uid", "guestbackup-bsls"))
			exprs, err := promexpr.Dashboard(data)
			Expect(err).NotTo(HaveOccurred())
			Expect(len(exprs)).To(BeNumerically(">=", 10))
		})
	})
})
