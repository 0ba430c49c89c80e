//! The ext_proc protocol's messages, as the GAIE endpoint picker speaks it: what kvgate reads
//! from Envoy (header values, the response status, the subset hint) and every answer it builds
//! (the routing answer with its header mutation and `envoy.lb` metadata, the body echoed in
//! `streamed_response` chunks, immediate error responses). No state and no decisions: the
//! stream's state machine is [`super`]'s.

use crate::errors::ApiError;
use crate::pods::Pod;
use envoy_types::pb::envoy::config::core::v3::{
    HeaderValue as PbHeaderValue, HeaderValueOption, Metadata,
    header_value_option::HeaderAppendAction,
};
use envoy_types::pb::envoy::service::ext_proc::v3::{
    BodyMutation, BodyResponse, CommonResponse, HeaderMutation, HeadersResponse, HttpHeaders,
    ImmediateResponse, ProcessingResponse, StreamedBodyResponse, body_mutation,
    processing_response,
};
use envoy_types::pb::envoy::r#type::v3::HttpStatus;
use envoy_types::pb::google::protobuf::{Struct, Value as PbValue, value::Kind};
use http::StatusCode;

/// The header (and `envoy.lb` metadata key) that names the chosen endpoint.
pub const DESTINATION_HEADER: &str = "x-gateway-destination-endpoint";
/// The dynamic-metadata namespace Envoy's load balancers read.
pub const LB_NAMESPACE: &str = "envoy.lb";
/// Largest `streamed_response` chunk (GAIE: some Envoys cap streamed chunks at 64 KiB).
pub const MAX_STREAMED_CHUNK: usize = 62_000;
/// The filter-metadata namespace of the data plane's subset hint.
pub const SUBSET_HINT_NAMESPACE: &str = "envoy.lb.subset_hint";
/// The key, inside [`SUBSET_HINT_NAMESPACE`], of the endpoints the picker must choose from.
pub const SUBSET_HINT_KEY: &str = "x-gateway-destination-endpoint-subset";

/// A header's value as Envoy sent it: `raw_value` when set, else `value`.
pub fn raw_value(hv: &PbHeaderValue) -> &[u8] {
    if hv.raw_value.is_empty() {
        hv.value.as_bytes()
    } else {
        &hv.raw_value
    }
}

/// The `:status` of a response's headers (0 when unreadable, 200 when absent) and whether its
/// `content-type` is `text/event-stream`.
pub fn response_head(h: &HttpHeaders) -> (u16, bool) {
    let mut status = 200u16;
    let mut event_stream = false;
    for hv in h.headers.iter().flat_map(|m| m.headers.iter()) {
        let raw = raw_value(hv);
        match hv.key.as_str() {
            ":status" => {
                status = std::str::from_utf8(raw)
                    .ok()
                    .and_then(|s| s.trim().parse().ok())
                    .unwrap_or(0)
            }
            "content-type" => {
                event_stream = raw
                    .get(..17)
                    .is_some_and(|p| p.eq_ignore_ascii_case(b"text/event-stream"))
            }
            _ => {}
        }
    }
    (status, event_stream)
}

/// The subset hint in `md`: None when the key is absent (no restriction), else the listed
/// `ip:port` endpoints — possibly none, which then admits no pod. List items that are not
/// strings are skipped; a string item may hold a comma-separated list.
pub fn subset_hint(md: &Metadata) -> Option<Vec<String>> {
    let value = md
        .filter_metadata
        .get(SUBSET_HINT_NAMESPACE)?
        .fields
        .get(SUBSET_HINT_KEY)?;
    let mut endpoints = Vec::new();
    let mut push = |s: &str| {
        endpoints.extend(
            s.split(',')
                .map(str::trim)
                .filter(|e| !e.is_empty())
                .map(str::to_string),
        )
    };
    match &value.kind {
        Some(Kind::ListValue(list)) => {
            for item in &list.values {
                if let Some(Kind::StringValue(s)) = &item.kind {
                    push(s);
                }
            }
        }
        Some(Kind::StringValue(s)) => push(s),
        _ => tracing::debug!("subset hint is neither a list nor a string; no pod may be picked"),
    }
    Some(endpoints)
}

/// Where Envoy sends a routed request: the pod's `host:port`, and for one engine of a
/// data-parallel server its rank (sent as `x-data-parallel-rank`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Destination {
    pub endpoint: String,
    pub rank: Option<u32>,
    /// More headers for the pod (the trace's `traceparent`, [`crate::otel`]).
    pub headers: Vec<(String, String)>,
}

impl Destination {
    /// `self` with `headers` also set on the request Envoy sends.
    pub fn with_headers(mut self, headers: &http::HeaderMap) -> Destination {
        for (name, value) in headers {
            if let Ok(v) = value.to_str() {
                self.headers
                    .push((name.as_str().to_string(), v.to_string()));
            }
        }
        self
    }
}

impl std::fmt::Display for Destination {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.rank {
            Some(r) => write!(f, "{} (rank {r})", self.endpoint),
            None => f.write_str(&self.endpoint),
        }
    }
}

/// `host:port` of a pod's URL (port 80/443 by scheme when absent), with its DP rank.
pub fn destination(pod: &Pod) -> Option<Destination> {
    let uri: http::Uri = pod.connect_url().parse().ok()?;
    let host = uri.host()?;
    let port = uri.port_u16().unwrap_or(match uri.scheme_str() {
        Some("https") => 443,
        _ => 80,
    });
    let endpoint = if host.contains(':') && !host.starts_with('[') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    Some(Destination {
        endpoint,
        rank: pod.rank,
        headers: Vec::new(),
    })
}

pub fn answer(response: processing_response::Response) -> ProcessingResponse {
    ProcessingResponse {
        response: Some(response),
        ..Default::default()
    }
}

fn header(key: &str, value: &str) -> HeaderValueOption {
    HeaderValueOption {
        header: Some(PbHeaderValue {
            key: key.to_string(),
            value: String::new(),
            raw_value: value.as_bytes().to_vec(),
        }),
        append_action: HeaderAppendAction::OverwriteIfExistsOrAdd as i32,
        ..Default::default()
    }
}

/// The request-headers answer that routes the request to `dest` (a body-less request, or a
/// FULL_DUPLEX_STREAMED one once its body is complete): the header mutation and `envoy.lb`
/// metadata.
pub fn routed_headers(dest: &Destination) -> ProcessingResponse {
    let mut resp = answer(processing_response::Response::RequestHeaders(
        HeadersResponse {
            response: Some(routing_response(dest)),
        },
    ));
    resp.dynamic_metadata = Some(lb_metadata(&dest.endpoint));
    resp
}

/// The request-body answer that routes a BUFFERED request to `dest`.
pub fn routed_body(dest: &Destination) -> ProcessingResponse {
    let mut resp = answer(processing_response::Response::RequestBody(BodyResponse {
        response: Some(routing_response(dest)),
    }));
    resp.dynamic_metadata = Some(lb_metadata(&dest.endpoint));
    resp
}

/// The request-body answer that routes a BUFFERED request to `dest` with its body replaced by
/// `body` (a P/D decode stage: the client's request with the prefill's transfer parameters).
/// In this mode `content-length` is the processor's to set (Envoy's `BodySendMode` docs).
pub fn routed_body_replaced(dest: &Destination, body: &[u8]) -> ProcessingResponse {
    let mut common = routing_response(dest);
    if let Some(m) = &mut common.header_mutation {
        m.set_headers
            .push(header("content-length", &body.len().to_string()));
    }
    common.body_mutation = Some(BodyMutation {
        mutation: Some(body_mutation::Mutation::Body(body.to_vec())),
    });
    let mut resp = answer(processing_response::Response::RequestBody(BodyResponse {
        response: Some(common),
    }));
    resp.dynamic_metadata = Some(lb_metadata(&dest.endpoint));
    resp
}

/// The request-headers answer of a FULL_DUPLEX_STREAMED request routed to `dest` whose body
/// (echoed after it, [`streamed_body`]) is `body_len` bytes long.
pub fn routed_headers_with_length(dest: &Destination, body_len: usize) -> ProcessingResponse {
    let mut resp = routed_headers(dest);
    if let Some(processing_response::Response::RequestHeaders(h)) = &mut resp.response
        && let Some(m) = h.response.as_mut().and_then(|c| c.header_mutation.as_mut())
    {
        m.set_headers
            .push(header("content-length", &body_len.to_string()));
    }
    resp
}

/// The answer that routes the request to `dest`.
fn routing_response(dest: &Destination) -> CommonResponse {
    let mut set_headers = vec![header(DESTINATION_HEADER, &dest.endpoint)];
    if let Some(rank) = dest.rank {
        set_headers.push(header(
            crate::upstream::DATA_PARALLEL_RANK_HEADER,
            &rank.to_string(),
        ));
    }
    for (name, value) in &dest.headers {
        set_headers.push(header(name, value));
    }
    CommonResponse {
        header_mutation: Some(HeaderMutation {
            set_headers,
            remove_headers: Vec::new(),
        }),
        clear_route_cache: true,
        ..Default::default()
    }
}

/// `{"envoy.lb": {"x-gateway-destination-endpoint": dest}}`.
fn lb_metadata(dest: &str) -> Struct {
    let inner = Struct {
        fields: [(
            DESTINATION_HEADER.to_string(),
            PbValue {
                kind: Some(Kind::StringValue(dest.to_string())),
            },
        )]
        .into_iter()
        .collect(),
    };
    Struct {
        fields: [(
            LB_NAMESPACE.to_string(),
            PbValue {
                kind: Some(Kind::StructValue(inner)),
            },
        )]
        .into_iter()
        .collect(),
    }
}

/// The body echoed as `streamed_response` chunks (FULL_DUPLEX_STREAMED), the last with
/// `end_of_stream` (an empty body: one empty chunk).
pub fn streamed_body(body: &[u8]) -> Vec<ProcessingResponse> {
    let chunks: Vec<&[u8]> = if body.is_empty() {
        vec![&[]]
    } else {
        body.chunks(MAX_STREAMED_CHUNK).collect()
    };
    let n = chunks.len();
    chunks
        .into_iter()
        .enumerate()
        .map(|(i, c)| {
            answer(processing_response::Response::RequestBody(BodyResponse {
                response: Some(CommonResponse {
                    body_mutation: Some(BodyMutation {
                        mutation: Some(body_mutation::Mutation::StreamedResponse(
                            StreamedBodyResponse {
                                body: c.to_vec(),
                                end_of_stream: i + 1 == n,
                                ..Default::default()
                            },
                        )),
                    }),
                    ..Default::default()
                }),
            }))
        })
        .collect()
}

/// An immediate response with the OpenAI-style error body.
pub fn immediate(err: &ApiError, request_id: &str) -> ProcessingResponse {
    let mut set_headers = vec![header("content-type", "application/json")];
    if !request_id.is_empty() {
        set_headers.push(header("x-request-id", request_id));
    }
    if err.status == StatusCode::TOO_MANY_REQUESTS || crate::flow::retry_after(err) {
        set_headers.push(header(
            "retry-after",
            &crate::limits::RETRY_AFTER_S.to_string(),
        ));
    }
    answer(processing_response::Response::ImmediateResponse(
        ImmediateResponse {
            status: Some(HttpStatus {
                code: i32::from(err.status.as_u16()),
            }),
            headers: Some(HeaderMutation {
                set_headers,
                remove_headers: Vec::new(),
            }),
            body: err.body_json().to_string().into_bytes(),
            grpc_status: None,
            details: err.code.to_string(),
        },
    ))
}

/// An immediate response that is a pod's own answer (a P/D prefill pod's 4xx): its status,
/// its end-to-end headers (Envoy sets the length) with `x-request-id`, and its body, as the
/// HTTP proxy passes it.
pub fn pod_answer(pod: &crate::pipeline::PodAnswer, request_id: &str) -> ProcessingResponse {
    let headers = crate::upstream::client_headers(&pod.headers, false, request_id, None);
    let set_headers = headers
        .iter()
        .map(|(name, value)| HeaderValueOption {
            header: Some(PbHeaderValue {
                key: name.as_str().to_string(),
                value: String::new(),
                raw_value: value.as_bytes().to_vec(),
            }),
            append_action: HeaderAppendAction::AppendIfExistsOrAdd as i32,
            ..Default::default()
        })
        .collect();
    answer(processing_response::Response::ImmediateResponse(
        ImmediateResponse {
            status: Some(HttpStatus {
                code: i32::from(pod.status.as_u16()),
            }),
            headers: Some(HeaderMutation {
                set_headers,
                remove_headers: Vec::new(),
            }),
            body: pod.body.to_vec(),
            grpc_status: None,
            details: "prefill_pod_answer".to_string(),
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn destination_is_host_port() {
        let pod = |url: &str| Pod::new(kvgate_core::PodId(0), url, "default", 1);
        assert_eq!(
            destination(&pod("http://10.0.0.5:8000"))
                .map(|d| d.endpoint)
                .as_deref(),
            Some("10.0.0.5:8000")
        );
        assert_eq!(
            destination(&pod("http://10.0.0.5"))
                .map(|d| d.endpoint)
                .as_deref(),
            Some("10.0.0.5:80")
        );
        assert_eq!(
            destination(&pod("http://[::1]:8000/"))
                .map(|d| d.endpoint)
                .as_deref(),
            Some("[::1]:8000")
        );
    }

    #[test]
    fn a_data_parallel_engine_is_routed_with_its_rank_header_and_a_plain_pod_without() {
        let set_headers = |resp: ProcessingResponse| -> Vec<(String, String)> {
            let Some(processing_response::Response::RequestHeaders(h)) = resp.response else {
                panic!("not a request-headers answer");
            };
            h.response
                .and_then(|c| c.header_mutation)
                .map(|m| m.set_headers)
                .unwrap_or_default()
                .into_iter()
                .filter_map(|o| o.header)
                .map(|h| (h.key, String::from_utf8_lossy(&h.raw_value).into_owned()))
                .collect()
        };
        let rank1 =
            Pod::data_parallel_rank(kvgate_core::PodId(1), "http://10.0.0.5:8000", "c", 1, 1, 2);
        let dest = destination(&rank1).unwrap();
        assert_eq!(dest.to_string(), "10.0.0.5:8000 (rank 1)");
        assert_eq!(
            set_headers(routed_headers(&dest)),
            [
                (DESTINATION_HEADER.to_string(), "10.0.0.5:8000".to_string()),
                ("x-data-parallel-rank".to_string(), "1".to_string())
            ]
        );
        let plain = destination(&Pod::new(
            kvgate_core::PodId(0),
            "http://10.0.0.6:8000",
            "c",
            1,
        ))
        .unwrap();
        assert_eq!(
            set_headers(routed_headers(&plain)),
            [(DESTINATION_HEADER.to_string(), "10.0.0.6:8000".to_string())]
        );
        // A traced request: its traceparent rides in the same mutation (otel.rs).
        let mut trace = http::HeaderMap::new();
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        trace.insert("traceparent", tp.parse().unwrap());
        assert_eq!(
            set_headers(routed_headers(&plain.with_headers(&trace))),
            [
                (DESTINATION_HEADER.to_string(), "10.0.0.6:8000".to_string()),
                ("traceparent".to_string(), tp.to_string())
            ]
        );
    }

    fn hint(value: Kind) -> Metadata {
        let inner = Struct {
            fields: [(SUBSET_HINT_KEY.to_string(), PbValue { kind: Some(value) })]
                .into_iter()
                .collect(),
        };
        Metadata {
            filter_metadata: [(SUBSET_HINT_NAMESPACE.to_string(), inner)]
                .into_iter()
                .collect(),
            ..Default::default()
        }
    }

    fn strings(items: &[&str]) -> Kind {
        Kind::ListValue(envoy_types::pb::google::protobuf::ListValue {
            values: items
                .iter()
                .map(|s| PbValue {
                    kind: Some(Kind::StringValue(s.to_string())),
                })
                .collect(),
        })
    }

    #[test]
    fn subset_hint_reads_the_list_and_tells_absent_from_empty() {
        assert_eq!(subset_hint(&Metadata::default()), None);
        let other_key = Metadata {
            filter_metadata: [(SUBSET_HINT_NAMESPACE.to_string(), Struct::default())]
                .into_iter()
                .collect(),
            ..Default::default()
        };
        assert_eq!(subset_hint(&other_key), None);
        assert_eq!(
            subset_hint(&hint(strings(&["10.0.0.1:8000", "10.0.0.2:8000"]))),
            Some(vec![
                "10.0.0.1:8000".to_string(),
                "10.0.0.2:8000".to_string()
            ])
        );
        assert_eq!(
            subset_hint(&hint(Kind::StringValue(
                "10.0.0.1:8000, 10.0.0.3:8000".into()
            ))),
            Some(vec![
                "10.0.0.1:8000".to_string(),
                "10.0.0.3:8000".to_string()
            ])
        );
        assert_eq!(subset_hint(&hint(strings(&[]))), Some(vec![]));
        assert_eq!(subset_hint(&hint(Kind::NumberValue(3.0))), Some(vec![]));
    }

    #[test]
    fn streamed_body_chunks_are_bounded_and_end_once() {
        let body = vec![b'x'; MAX_STREAMED_CHUNK * 2 + 5];
        let out = streamed_body(&body);
        assert_eq!(out.len(), 3);
        let mut total = 0;
        for (i, r) in out.iter().enumerate() {
            let Some(processing_response::Response::RequestBody(b)) = &r.response else {
                panic!("not a body response");
            };
            let Some(body_mutation::Mutation::StreamedResponse(s)) = b
                .response
                .as_ref()
                .and_then(|c| c.body_mutation.as_ref())
                .and_then(|m| m.mutation.as_ref())
            else {
                panic!("not streamed");
            };
            assert!(s.body.len() <= MAX_STREAMED_CHUNK);
            assert_eq!(s.end_of_stream, i == 2);
            total += s.body.len();
        }
        assert_eq!(total, body.len());
        assert_eq!(streamed_body(&[]).len(), 1);
    }
}
