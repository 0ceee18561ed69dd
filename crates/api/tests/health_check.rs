//! `healthCheck` of LLMProvider (DESIGN §4.8, field case 26): per-modality probe settings load,
//! the new modalities parse, and the client-side checks refuse what the API server would.

use std::path::Path;

use switchyard_api::loader::load_texts;
use switchyard_api::provider::Modality;

const GOOD: &str = r#"
apiVersion: switchyard.dev/v1alpha1
kind: LLMProvider
metadata:
  name: p-mix
spec:
  api: openai
  endpoint: https://api.example.com
  models:
    - name: chat-1
    - name: whisper-1
      modalities: [transcription]
    - name: tts-1
      modalities: [speech]
  healthCheck:
    enabled: true
    interval: 30s
    failureThreshold: 2
    latencyThreshold: 3s
    timeout: 8s
    probes:
      - modality: speech
        model: tts-1
        voice: v2
        timeout: 5s
      - modality: transcription
        latencyThreshold: 6s
"#;

#[test]
fn health_check_probes_load_with_new_modalities() {
    let m = load_texts([(Path::new("good.yaml"), GOOD)]).unwrap_or_else(|e| panic!("{e}"));
    let hc = m.providers[0].spec.health_check.clone().unwrap_or_default();
    assert_eq!(hc.latency_threshold.as_deref(), Some("3s"));
    assert_eq!(hc.timeout.as_deref(), Some("8s"));
    assert_eq!(hc.probes.len(), 2);
    assert_eq!(hc.probes[0].modality, Modality::Speech);
    assert_eq!(hc.probes[0].voice.as_deref(), Some("v2"));
    assert_eq!(hc.probes[1].modality, Modality::Transcription);
    assert_eq!(
        m.providers[0].spec.models[1].modalities,
        [Modality::Transcription]
    );
}

#[test]
fn health_check_duplicate_modality_probe_rejected() {
    let text = GOOD.replace("modality: transcription", "modality: speech");
    let errors = match load_texts([(Path::new("dup.yaml"), text.as_str())]) {
        Ok(_) => panic!("two probe entries for one modality must be refused"),
        Err(e) => e.0,
    };
    assert!(
        errors.iter().any(|e| e
            .reason
            .contains("at most one healthCheck.probes[] entry per modality")),
        "{errors:#?}"
    );
}

#[test]
fn health_check_bad_duration_rejected() {
    let text = GOOD.replace("latencyThreshold: 3s", "latencyThreshold: soon");
    assert!(load_texts([(Path::new("bad.yaml"), text.as_str())]).is_err());
}
