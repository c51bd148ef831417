// Table-driven tests of the math verifier: answer equivalence by category
// (true positives and true negatives), extraction from whole responses, and
// the MathVerifier reward policy.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "lockstep/reward/math_text.h"
#include "lockstep/reward/math_verifier.h"

namespace lockstep::reward {
namespace {

struct Case {
  const char* gold;
  const char* pred;
  bool expected;
};

void run_table(const char* category, const std::vector<Case>& cases) {
  int failed = 0;
  for (const auto& c : cases) {
    bool got = math_answers_equivalent(c.gold, c.pred);
    if (got != c.expected) ++failed;
    EXPECT_EQ(got, c.expected) << category << ": gold=[" << c.gold << "] pred=[" << c.pred << "]";
  }
  std::printf("[%s] %zu cases, %d wrong\n", category, cases.size(), failed);
}

TEST(MathEquivalence, Integers) {
  run_table("integers", {
                            {"42", "42", true},
                            {"42", "43", false},
                            {"-5", "-5", true},
                            {"-5", "5", false},
                            {"0", "-0", true},
                            {"7425000", "7,425,000", true},
                            {"1000", "1 000", true},
                            {"1000", "1000.0", true},
                            {"14916", "14{,}916", true},
                            {"12000023", "12,\\!000,\\!023", true},
                            {"11111111100", "11,\\! 111,\\! 111,\\! 100", true},
                            {"32349", "32, 349", false},
                            {"123456789012345678901234567890", "123456789012345678901234567890", true},
                            {"123456789012345678901234567890", "123456789012345678901234567891", false},
                            {"100000000000000000001", "10^{20}+1", true},
                            {"100000000000000000000", "10^{20}+1", false},
                            {"1267650600228229401496703205376", "2^{100}", true},
                            {"1267650600228229401496703205377", "2^{100}", false},
                            {"5866608", "5866608", true},
                            {"204_5", "204_5", true},
                            {"54", "204_5", true},
                            {"1112112_3", "1112122_3", false},
                        });
}

TEST(MathEquivalence, Fractions) {
  run_table("fractions", {
                             {"\\frac{1}{2}", "0.5", true},
                             {"\\frac{1}{2}", "1/2", true},
                             {"\\frac12", "\\frac{1}{2}", true},
                             {"\\dfrac{3}{4}", "\\tfrac{3}{4}", true},
                             {"\\frac{2}{4}", "\\frac{1}{2}", true},
                             {"\\frac{1}{2}", "\\frac{1}{3}", false},
                             {"1/3", "0.33", false},
                             {"\\frac{1}{3}", "0.3333333", true},
                             {"\\frac{1}{3}", "0.333", true},  // see DecimalApproximations
                             {"\\frac{10}{9}", "10/9", true},
                             {"-\\frac{10}{9}", "-10/9", true},
                             {"-\\frac{10}{9}", "\\frac{10}{9}", false},
                             {"1", "\\frac3{3}", true},
                             {"\\frac{1}{3}", "\\frac13", true},
                             {"\\frac{1}{3}", "\\cfrac{1}{3}", true},
                             {"0.4", ".4", true},
                             {"\\frac{1}{12}", "0.0833333333333333", true},
                             {"2\\frac{1}{2}", "2.5", true},
                             {"2\\frac{1}{2}", "\\frac{5}{2}", true},
                             {"-2\\frac{1}{2}", "-\\frac{5}{2}", true},
                             {"\\frac{9}{4}\\pi", "\\frac94\\pi", true},
                             {"\\frac{3}{56}", "\\frac{6}{112}", true},
                             {"\\frac{14}{3}", "4.67", false},
                         });
}

TEST(MathEquivalence, Decimals) {
  run_table("decimals", {
                            {"3.14", "3.14", true},
                            {"3.14", "3.1400", true},
                            {"3.14", "3.15", false},
                            {"0.1", "0.10000001", true},
                            {"0.1", "0.1001", false},
                            {"1000.99", "1,000.99", true},
                            {"16386.20", "16,386.20", true},
                            {"2.5", "5/2", true},
                            {"1500", "1.5\\times 10^{3}", true},
                            {"0.001", "1e-3", true},
                            {"0", "0.000001", false},
                            {"7.78", "\\frac{70}{9}", false},
                        });
}

// A decimal with 3+ places equals a fraction without a finite decimal
// expansion when it is that fraction rounded or cut to its places and
// within 1e-3 of it (relative); either side may be the label.
TEST(MathEquivalence, DecimalApproximations) {
  run_table("decimal_approx", {
                                  {"\\frac13", "0.333", true},
                                  {"\\frac{1}{3}", "0.3333", true},
                                  {"\\frac{2}{3}", "0.667", true},
                                  {"\\frac{2}{3}", "0.666", true},  // cut, not rounded
                                  {"\\frac{2}{3}", "0.6667", true},
                                  {"\\frac{100}{3}", "33.333", true},
                                  {"\\frac{1}{7}", "0.143", true},
                                  {"-\\frac{1}{3}", "-0.333", true},
                                  {"0.333", "\\frac{1}{3}", true},  // label decimal, answer fraction
                                  {"0.667", "2/3", true},
                                  {"4.667", "\\frac{14}{3}", true},
                                  {"(\\frac13, \\frac23)", "(0.333, 0.667)", true},
                                  {"\\frac{2}{3}", "0.668", false},  // neither rounded nor cut
                                  {"\\frac{1}{3}", "0.334", false},
                                  {"\\frac{1}{3}", "0.33", false},  // 2 places: too few
                                  {"\\frac{14}{3}", "4.67", false},
                                  {"\\frac{100}{3}", "33.3", false},
                                  {"\\frac{1}{7}", "0.142", false},     // cut, but 0.6% away
                                  {"\\frac{1}{1500}", "0.001", false},  // rounded, but 50% away
                                  {"-\\frac{1}{3}", "0.333", false},
                                  {"\\frac{1}{8}", "0.126", false},  // 1/8 = 0.125 has a finite expansion
                                  {"\\frac{1}{8}", "0.125", true},
                                  {"5", "5.001", false},
                                  {"\\sqrt{2}", "1.414", false},  // irrational: only the tolerance
                                  {"1.333", "\\frac{1}{3}", false},
                              });
}

// Solution sets written as assignments: against a tuple, the values in the
// alphabetical order of their variables; against assignments, by name.
TEST(MathEquivalence, AssignmentsAndTuples) {
  run_table("assignments", {
                               {"(1,2)", "x=1, y=2", true},
                               {"(1,2)", "y=2, x=1", true},
                               {"x=1, y=2", "(1,2)", true},
                               {"x=1, y=2", "y=2, x=1", true},
                               {"(x,y)=(1,2)", "x=1 \\text{ and } y=2", true},
                               {"(3,-1,2)", "a=3, b=-1, c=2", true},
                               {"(1,2)", "x=2, y=1", false},
                               {"x=1, y=2", "x=2, y=1", false},
                               {"x=1, y=2", "x=1, z=2", false},
                               {"(1,2,3)", "x=1, y=2", false},
                               {"(1,2)", "x=1, y=2, z=3", false},
                               {"x=1, x=2", "1, 2", true},  // one variable twice: its two values
                           });
}

// Inequality chains against intervals; a list of inequalities in one
// variable ("x < 1 or x > 2") against a union of intervals.
TEST(MathEquivalence, InequalitiesAsIntervals) {
  run_table("inequality_intervals",
            {
                {"(1,3]", "1 < x \\le 3", true},
                {"1 < x \\le 3", "(1, 3]", true},
                {"[2,\\infty)", "x \\ge 2", true},
                {"(1,3]", "3 \\ge x > 1", true},
                {"(-\\infty,1)\\cup(2,\\infty)", "x<1 \\text{ or } x>2", true},
                {"x<1 \\text{ or } x>2", "(2,\\infty)\\cup(-\\infty,1)", true},
                {"(-\\infty,-3]\\cup[2,\\infty)", "x \\le -3 \\text{ or } x \\ge 2", true},
                {"(1,3]", "1 \\le x \\le 3", false},
                {"(1,3]", "1 < x < 3", false},
                {"x<3", "x\\le 3", false},
                {"(-\\infty,3)", "x \\le 3", false},
                {"[2,\\infty)", "x > 2", false},
                {"(-\\infty,1)\\cup(2,\\infty)", "x \\le 1 \\text{ or } x>2", false},
                {"(-\\infty,1)\\cup(2,\\infty)", "x<1 \\text{ or } y>2", false},
                {"(-\\infty,1)\\cup(2,\\infty)", "x<1", false},
                {"(-\\infty,1)\\cup(2,\\infty)", "x<1 \\text{ or } x>2 \\text{ or } x>5", false},
            });
}

// Units and words around a number are dropped, not compared or converted.
TEST(MathEquivalence, UnitsAndWordsAroundNumbers) {
  run_table("units_words", {
                               {"5", "5\\text{ cm}", true},
                               {"5", "\\text{5 apples}", true},
                               {"5", "\\$5", true},
                               {"5", "5 dollars", true},
                               {"50", "50\\%", true},
                               {"5\\text{ cm}", "5\\text{ m}", true},  // units are not compared
                               {"6", "5\\text{ cm}", false},
                               {"50", "\\text{5 apples}", false},
                               {"\\$5", "\\$50", false},
                               {"50\\%", "5", false},
                               {"50\\%", "0.05", false},
                               {"5 dollars", "6", false},
                           });
}

// Near misses that must stay apart.
TEST(MathEquivalence, NearMisses) {
  run_table("near_misses", {
                               {"1+1/e", "1-1/e", false},
                               {"1+\\frac{1}{e}", "1+\\frac{1}{e}", true},
                               {"(1,2)", "(2,1)", false},
                               {"\\{1,2\\}", "\\{2,1\\}", true},
                               {"x<3", "x \\le 3", false},
                               {"x \\le 3", "x<3", false},
                           });
}

TEST(MathEquivalence, Expressions) {
  run_table("expressions", {
                               {"2\\sqrt{3}", "\\sqrt{12}", true},
                               {"\\sqrt{12}", "2\\sqrt{3}", true},
                               {"\\sqrt{2}", "\\sqrt2", true},
                               {"\\sqrt{3}", "\\sqrt 3", true},
                               {"\\sqrt{2}", "1.414", false},
                               {"\\sqrt{2}", "1.41421356237", true},
                               {"\\frac{\\pi}{4}", "\\pi/4", true},
                               {"\\frac{\\pi}{4}", "0.785398163", true},
                               {"\\frac{\\pi}{4}", "\\frac{\\pi}{3}", false},
                               {"3^{2}", "9", true},
                               {"3^2", "6", false},
                               {"2^{10}", "1024", true},
                               {"\\sqrt{2}+\\sqrt{5}", "\\sqrt 2+\\sqrt 5", true},
                               {"3\\sqrt{13}", "\\sqrt{117}", true},
                               {"\\frac{\\sqrt{3}}{2}", "\\frac{1}{2}\\sqrt{3}", true},
                               {"\\sqrt[3]{8}", "2", true},
                               {"\\sqrt[3]{-27}", "-3", true},
                               {"4", "4\\sqrt{2}", false},
                               {"2", "\\frac{1+\\sqrt{5}}{2}", false},
                               {"1\\sqrt{19}", "1", false},
                               {"\\left( \\frac{1}{3} \\right)", "\\frac{1}{3}", true},
                               {"5!", "120", true},
                               {"\\binom{5}{2}", "10", true},
                               {"\\log_2 8", "3", true},
                               {"\\ln(e^2)", "2", true},
                               {"|-3|", "3", true},
                               {"\\frac{5\\sqrt{42}}{27}", "\\frac{10\\sqrt{10.5}}{27}", true},
                               {"\\frac{\\sqrt{\\sqrt{11}+\\sqrt{194}}}{15+2\\sqrt{33}}",
                                "\\frac{\\sqrt{\\sqrt{11}+\\sqrt{194}}}{2\\sqrt{33}+15}", true},
                               {"10^{10^{10}}", "10^{10^{10}}", true},
                               {"10^{10^{10}}", "1", false},
                               {"2\\pi", "6.283185307", true},
                           });
}

TEST(MathEquivalence, Symbolic) {
  run_table("symbolic", {
                            {"x+1", "1+x", true},
                            {"2x+1", "x+1", false},
                            {"\\frac{x+2}{7}", "\\frac{x}{7}+\\frac{2}{7}", true},
                            {"\\tan^2(y)+1", "\\sec^2(y)", true},
                            {"(a+5)(b+2)", "(+5)(b+2)", false},
                            {"x^2-1", "(x-1)(x+1)", true},
                            {"\\sqrt{x^2}", "x", false},
                            {"2-2p", "2-2p", true},
                            {"2-2p", "2p-2", false},
                            {"\\frac{\\pi r}{h+r}", "\\frac{\\pi r}{r+h}", true},
                            {"2 \\sin b \\cos a", "2\\cos a \\sin b", true},
                            {"x+2n+1", "x+1", false},
                            {"f(x)", "f(y)", false},
                            {"\\frac{1}{3x^{2/3}}", "\\frac{1}{3\\sqrt[3]{x}^2}", true},
                        });
}

TEST(MathEquivalence, Equations) {
  run_table("equations", {
                             {"5", "x = 5", true},
                             {"x = 5", "5", true},
                             {"x=5", "x = 6", false},
                             {"k=1", "1", true},
                             {"\\frac{1}{3}", "k = \\frac{1}{3}", true},
                             {"y = 2x+3", "y=3+2x", true},
                             {"y = 2x+3", "y=3x+2", false},
                             {"2x+4y-3=0", "y=-\\frac{1}{2}x+\\frac{3}{4}", true},
                             {"34x+45y-20z+100=0", "-34x-45y+20z-100=0", true},
                             {"x^2/4 + y^2/3 = 1", "x^2/16+y^2/12 = 1/4", true},
                             {"7 = 11a+c", "11a+c", false},
                             {"2x + z = 1", "1", false},
                             {"a^2 + b = 0", "0", false},
                             {"x = 11", "x = 5+5+1 = 7 = 11", true},
                             {"z = 1 + 1 = 2", "z = 3+3 = 2", true},
                             {"1 = \\zzz = x = 0", "0", true},
                             {"1/3", "x=1/3\\approx 0.33", true},
                             {"11", "x\\approx 11", true},
                             {"10/9", "\\frac{1}{2} \\$ = \\frac{10}{9}", true},
                             {"(p,q)=(3,2)", "(3,2)", true},
                             {"P(x) = 1", "p(x) = 1", true},
                             {"\\frac{NO}{BO}=\\frac{1}{\\sqrt{6}}", "\\frac{1}{\\sqrt{6}}", true},
                             {"AB=4,CD=5", "4, 5", true},
                             {"x = -5,\\ p = \\frac{14}{3}", "-5, \\frac{14}{3}", true},
                             {"a=4,\\,-8,\\,-10", "-10,-8,4", true},
                             {"p=5,q=2;p=7,q=2", "p = 5, q = 2 \\quad \\text{and} \\quad p = 7, q = 2", true},
                         });
}

TEST(MathEquivalence, Tuples) {
  run_table("tuples", {
                          {"(1,2)", "(1,2)", true},
                          {"(1,2)", "(2,1)", false},
                          {"(6,31,-1)", "(6, 31, -1)", true},
                          {"(1,\\frac{9}{2})", "(1,4.5)", true},
                          {"\\left(\\frac{1}{5},\\frac{1}{6}\\right)", "\\left( \\frac{1}{5}, \\frac{1}{6} \\right)", true},
                          {"(3, \\frac{\\pi}{2})", "\\left( 3, \\frac{\\pi}{2} \\right)", true},
                          {"(1,2,3)", "(1,2)", false},
                          {"(3,1)", "{1,3}", false},
                          {"(1,3)", "{1,3}", true},
                          {"\\langle 1,2\\rangle", "(1,2)", true},
                          {"(2,1),(1,2),(-1,-20),(-20,-1)", "(1, 2), (2, 1), (-1, -20), (-20, -1)", true},
                          {"(37,3,3),(17,3,3,7)", "(17,3,3,7),(37,3,3,13)", false},
                      });
}

TEST(MathEquivalence, Sets) {
  run_table("sets", {
                        {"\\{1,2\\}", "\\{2,1\\}", true},
                        {"\\{1,2\\}", "\\{1,3\\}", false},
                        {"\\{1,2\\}", "\\{1,2,3\\}", false},
                        {"1,2,3", "3,2,1", true},
                        {"-2,1", "1,-2", true},
                        {"1, 2, 3", "1, 2, 3, \\ldots", false},
                        {"1 \\pm \\sqrt{19}", "1+\\sqrt{19}, 1-\\sqrt{19}", true},
                        {"1 \\pm \\sqrt{19}", "1+\\sqrt{19}", false},
                        {"3 \\pm 2 \\sqrt{2}", "3 \\pm 2\\sqrt2", true},
                        {"\\{1\\pm\\sqrt{5},-2\\}", "\\{-2, 1+\\sqrt5, 1-\\sqrt5\\}", true},
                        {"\\emptyset", "\\{\\}", true},
                        {"\\emptyset", "\\{0\\}", false},
                        {"-12;-11;-10", "\\{-10,-11,-12\\}", true},
                        {"21,16 or 11", "21,16,11", true},
                        {"1 and 2 and 3", "1,2,3", true},
                        {"6 \\text{ and } 8", "6,8", true},
                    });
}

TEST(MathEquivalence, Intervals) {
  run_table("intervals", {
                             {"[1,2)", "[1,2]", false},
                             {"[1,2)", "[1,2)", true},
                             {"(0,9)", "[0,9)", false},
                             {"[0,9)", "[0,1)", false},
                             {"(-\\infty, 3]", "(-\\infty,3]", true},
                             {"(-\\infty, 3]", "(-\\infty,3)", false},
                             {"(-\\infty, -3] \\cup [2, \\infty)", "[2,\\infty) \\cup (-\\infty,-3]", true},
                             {"(-\\infty, -3] \\cup [2, \\infty)", "(-\\infty, -3) \\cup [2, \\infty)", false},
                             {"[-1, -\\frac{1}{2}) \\cup (-\\frac{1}{2}, 0)", "[-1, -\\tfrac12) \\cup (-\\tfrac12, 0)", true},
                             {"(\\frac{3}{5},\\frac{8}{3}]", "(0.6,\\frac{8}{3}]", true},
                             {"[-2,7]", "x \\in [-2,7]", true},
                             {"-2 \\le x \\le 7", "x \\in [-2,7]", true},
                             {"x > 5", "(5, \\infty)", true},
                             {"x \\geq 5", "[5,\\infty)", true},
                             {"x > 5", "[5,\\infty)", false},
                             {"0<f(x)<1", "(0,1)", true},
                             {"\\{-1\\} \\cup [0,7)", "\\{-1\\} \\cup [0,7)", true},
                         });
}

TEST(MathEquivalence, Inequalities) {
  run_table("inequalities", {
                                {"x >= 5", "x \\geq 5", true},
                                {"x < 3", "x \\lt 3", true},
                                {"x \\leq 2", "x <= 2", true},
                                {"x > 5", "x < 5", false},
                                {"x \\geq 5", "x \\leq 5", false},
                                {"x \\leq 5", "5 \\geq x", true},
                                {"x < 1", "-x > -1", true},
                                {"x < 1", "x > -1", false},
                                {"x \\neq 3", "x != 3", true},
                                {"x <= 1", "-x >= -1", true},
                            });
}

// Policy: "x%" matches x and x/100; a bare number never matches 100x or x/100.
TEST(MathEquivalence, Percentages) {
  run_table("percent", {
                           {"50\\%", "50", true},
                           {"50\\%", "0.5", true},
                           {"50", "0.5", false},
                           {"50", "50\\%", true},
                           {"0.5", "50\\%", true},
                           {"28\\%", "28 percent", true},
                           {"28\\%", "28 pct", true},
                           {"28\\%", "28 %", true},
                           {"0.28", "28", false},
                           {"28", "28/100", false},
                           {"\\frac{28}{100}", "28", false},
                           {"20\\%", "20 \\%", true},
                           {"25\\%", "0.25", true},
                           {"25\\%", "0.3", false},
                           {"100%", "100\\%", true},
                       });
}

TEST(MathEquivalence, UnitsTextAndNoise) {
  run_table("units_text", {
                              {"15\\mbox{ cm}^2", "15", true},
                              {"125 miles", "125\\textnormal{ miles}", true},
                              {"5", "5 \\text{ cm}", true},
                              {"5", "5 cm", true},
                              {"90^\\circ", "90", true},
                              {"90^{\\circ}", "90^\\circ", true},
                              {"30", "30 degrees", true},
                              {"30", "31 degrees", false},
                              {"\\$18.90", "18.90", true},
                              {"18.90", "\\$18.90", true},
                              {"1000.99", "$1,000.99", true},
                              {"\\frac{1}{3}", "\\frac{1}{3} \\textbf{meters}", true},
                              {"10", "10 dollars", true},
                              {"\\text{Evelyn}", "Evelyn", true},
                              {"\\text{Evelyn}", "Carla", false},
                              {"\\text{odd}", "odd", true},
                              {"\\text{E}", "E", true},
                              {"d", "\\text{E}", false},
                              {"Yes", "yes", true},
                              {"\\frac{1}{3}", "\\frac{1}{3}.", true},
                              {"42", "42.", true},
                              {"(1,2)", "(1,2).", true},
                              {"\\sqrt{2}", "\\sqrt{2}.", true},
                              {"2", "2^{10}", false},
                          });
}

TEST(MathEquivalence, MultipleChoice) {
  run_table("choice", {
                          {"B", "(B)", true},
                          {"B", "\\text{(B)}", true},
                          {"(C)", "C", true},
                          {"C", "\\textbf{(C)}", true},
                          {"B", "(C)", false},
                          {"A", "(A) 42", true},
                          {"D", "d", true},
                          {"\\text{C}", "\\text{(C)}", true},
                          {"E", "A", false},
                          {"C", "C. x = 42", true},
                          {"C. x = 42", "C", true},
                          {"C", "D. x = 42", false},
                      });
}

TEST(MathEquivalence, Matrices) {
  run_table("matrices",
            {
                {"\\begin{pmatrix}1 & 0 \\\\ 0 & 1\\end{pmatrix}", "\\begin{bmatrix}1&0\\\\0&1\\end{bmatrix}", true},
                {"\\begin{pmatrix}1 & 2 \\\\ 3 & 4\\end{pmatrix}", "\\begin{pmatrix}1 & 2 \\\\ 3 & 5\\end{pmatrix}", false},
                {"\\begin{pmatrix}\\frac{1}{2} \\\\ 3\\end{pmatrix}", "\\begin{pmatrix}0.5 \\\\ 3\\end{pmatrix}", true},
                {"\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}", "(1,2)", true},
                {"\\begin{pmatrix}1 & 2 \\\\3 & 4\\end{pmatrix}", "\\left[\\begin{array}{cc}1 & 2 \\\\3 & 4\\end{array}\\right]", true},
                {"\\begin{pmatrix}1 & 2\\end{pmatrix}", "\\begin{pmatrix}1 \\\\ 2 \\\\ 3\\end{pmatrix}", false},
                // Sums, products and multiples of numeric matrices.
                {"\\begin{pmatrix}6&8\\\\10&12\\end{pmatrix}", "\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}+\\begin{pmatrix}5&6\\\\7&8\\end{pmatrix}", true},
                {"\\begin{pmatrix}6&8\\\\10&13\\end{pmatrix}", "\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}+\\begin{pmatrix}5&6\\\\7&8\\end{pmatrix}", false},
                {"\\begin{pmatrix}19&22\\\\43&50\\end{pmatrix}", "\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}\\begin{pmatrix}5&6\\\\7&8\\end{pmatrix}", true},
                {"\\begin{pmatrix}23&34\\\\31&46\\end{pmatrix}", "\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}\\begin{pmatrix}5&6\\\\7&8\\end{pmatrix}", false},  // B A
                {"\\begin{pmatrix}2&4\\\\6&8\\end{pmatrix}", "2\\begin{pmatrix}1&2\\\\3&4\\end{pmatrix}", true},
                {"\\begin{pmatrix}-1&-2\\end{pmatrix}", "-\\begin{pmatrix}1&2\\end{pmatrix}", true},
                {"\\begin{pmatrix}2&4\\end{pmatrix}", "\\begin{pmatrix}1&2\\end{pmatrix}+\\begin{pmatrix}1\\\\2\\end{pmatrix}", false},  // shapes differ
                {"4", "\\begin{pmatrix}1&2\\end{pmatrix}\\begin{pmatrix}1\\\\2\\end{pmatrix}", false},  // 1x1 is a matrix
            });
}

TEST(MathEquivalence, Ratios) {
  run_table("ratios", {
                          {"7:32", "7:32", true},
                          {"S_{MBCN}:S=7:32", "7:32", true},
                          {"1:2", "2:4", true},
                          {"1:2", "2:1", false},
                          {"V_{1}:V_{2}=11:21", "11:21", true},
                      });
}

// Pairs that must hold in both directions (equivalence is symmetric except
// for a response's "expression = value", which these avoid).
TEST(MathEquivalence, SymmetricPairs) {
  std::vector<Case> pairs = {
      {"918\\frac{1}{2}", "918.5", true},
      {"x^2+2x+1", "x^2 + 2*x - (-1)", true},
      {"y = x^2+2x+1", "2x+ 1+x^2", true},
      {"E", "\\mathrm{E}", true},
      {"016", "16", true},
      {"\\frac {1}{2}", "0.5", true},
      {"17\\text{ any text}", "17", true},
      {"(r+5)(r+5)", "(r+5)^2", true},
      {"\\frac{\\sqrt{3}}{3}", "\\frac{\\sqrt{3}}{3} \\approx 0.577", true},
      {"\\begin{pmatrix}0&1\\\\1&0\\end{pmatrix}", "\\begin{bmatrix} 0 & 1 \\\\ 1 & 0 \\end{bmatrix}", true},
      {"\\\\frac{1}{2}", "0.5", true},  // text escaped twice
      {"5", "5.001", false},
      {"odd", "\\text{oddd}", false},
      {"E", "\\mathrm{E}*2", false},
      {"\\sqrt{67},-\\sqrt{85}", "\\sqrt{67}", false},
      {"\\pm 2021", "2021", false},
      {"\\pm 2021", "\\{-2021, 2021\\}", true},
      {"12:00", "1:00", false},
      {"19, 46, and 82", "19, 46, \\text{ and } 82", true},
      {"1 - \\frac{1}{\\mathrm{e}}", "1 + \\frac{1}{\\mathrm{e}}", false},
  };
  std::vector<Case> both;
  for (const auto& c : pairs) {
    both.push_back(c);
    both.push_back({c.pred, c.gold, c.expected});
  }
  run_table("symmetric", both);
}

struct ResponseCase {
  const char* response;
  const char* label;
  bool expected;
};

TEST(MathResponse, ExtractionAndGrading) {
  std::vector<ResponseCase> cases = {
      {"The answer is \\boxed{42}.", "42", true},
      {"So $x = \\boxed{\\frac{1}{2}}$", "0.5", true},
      {"\\boxed 5", "5", true},
      {"We get \\fbox{7}.", "7", true},
      {"First \\boxed{3}, but after checking, finally \\boxed{4}.", "4", true},
      {"First \\boxed{3}, but after checking, finally \\boxed{4}.", "3", false},
      {"\\boxed{\\{1,2\\}}", "\\{2,1\\}", true},
      {"\\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{1}{\\sqrt{2}}", true},
      {"The integers are \\boxed{-2} and \\boxed{1}.", "1,-2", true},
      {"\\[ \\boxed{-2} \\quad \\text{and} \\quad \\boxed{1}. \\]", "n = \\boxed{1,-2}", true},
      {"<think>let me see</think><answer>17</answer>", "17", true},
      {"<answer>12</answer> wait, no: <answer>13</answer>", "13", true},
      {"<answer>12</answer> wait, no: <answer>13</answer>", "12", false},
      {"Some reasoning.\nAnswer: 42", "42", true},
      {"Final Answer: The final answer is $28 \\%$. I hope it is correct.", "28\\%", true},
      {"Final Answer: The largest $n$ is 34.", "34", true},
      {"Final Answer: Jane started growing Sphere 3 hours ago. I hope it is correct.", "3", true},
      {"Final Answer: The volume of $ABCDEFGH$ is 120. I hope it is correct.", "120", true},
      {"So the answer is 7.", "7", true},
      {"So the answer is 7.", "8", false},
      {"the answer is (B).", "B", true},
      {"Answer \\[ 9 \\]", "9", true},
      {"Answer $ 9 $", "9", true},
      {"Answer \\( (9+1) \\)", "10", true},
      {"Therefore, there are 12 distinct sequences that meet the conditions.", "12", true},
      {"the number is not 10 which is 1,000.99 euros", "1000.99", true},
      {"AZYUK2A", "2", false},
      {"x = 5", "5", true},
      {"\\frac{1}{3}", "1/3", true},
      {"$\\frac{1}{3}$", "$1/3$", true},
      {"I don't know.", "5", false},
      {"", "5", false},
      {"\\boxed{", "5", false},
      {"Thus the total is 70 apples.\nAnswer: 70", "70", true},
      {"\\boxed{14}", "so the answer is \\boxed{14}.", true},
      {"If its initial value was $x$, the loss is $\\boxed{28\\%}$.", "$28\\%$", true},
      {"The distance is $\\boxed{125\\textnormal{ miles}}.$", "$125$ miles", true},
      {"Therefore $\\boxed{\\text{Evelyn}}$ is our answer.", "$\\text{Evelyn}$", true},
      {"Rounded, the investment is worth $\\boxed{\\$16,\\!386.20}$.", "$16386.20$", true},
      {"The answer is $\\frac{1}{3}.$", "$\\frac{1}{3}$", true},
      {"The answer is $1/3.$", "$1$", false},
      {"Thus, the answer is $x \\in \\boxed{(2,12) \\cup (12,102)}$", "(2, 12) \\cup (12, 102)", true},
      {"**Final Answer**\n\\boxed{189}", "189", true},
      {"solutions are:\n\\[\n\\boxed{(1, 2)}, \\boxed{(2, 1)}\n\\]", "(2,1),(1,2)", true},
      // Vectors and matrices in running text: the last one is the answer.
      {"The direction vector is \\begin{pmatrix} 3 \\\\ 2 \\\\ -6 \\end{pmatrix}.", "\\begin{pmatrix}3\\\\2\\\\-6\\end{pmatrix}", true},
      {"The direction vector is \\begin{pmatrix} 3 \\\\ 2 \\\\ -6 \\end{pmatrix}.", "(3,2,-6)", true},
      {"First \\begin{pmatrix}1\\\\2\\end{pmatrix}, then scaled \\begin{bmatrix}2\\\\4\\end{bmatrix}.", "(2,4)", true},
      {"First \\begin{pmatrix}1\\\\2\\end{pmatrix}, then scaled \\begin{bmatrix}2\\\\4\\end{bmatrix}.", "(1,2)", false},
      {"So the point is (1, 2, 3).", "(1,2,3)", true},
      {"So the point is (1, 2, 3).", "(3,2,1)", false},
      {"So the point is (1, 2, 3).", "3", false},
      {"The vector is \\langle 1,2\\rangle.", "(1,2)", true},
      {"The vector is \\langle 1,2\\rangle.", "(2,1)", false},
      {"Then f(1, 2) gives 7", "7", true},
      {"Using the points (1, 2) and (3, 4), the distance is 5", "5", true},
      {"We get (see steps 1, 2) 9", "9", true},
      // Several boxes that together are one answer.
      {"$x=\\boxed{2}$ and $y=\\boxed{3}$", "(2,3)", true},
      {"$x=\\boxed{2}$ and $y=\\boxed{3}$", "(3,2)", false},
      {"\\boxed{2} and \\boxed{3}", "\\{2,3\\}", true},
      {"\\boxed{2} and \\boxed{3}", "2, 3", true},
      {"\\boxed{2} and \\boxed{3}", "\\{2,4\\}", false},
      {"\\boxed{2} and \\boxed{3}", "3", false},
      {"I first got \\boxed{2}, but the answer is \\boxed{3}", "3", true},
      {"\\boxed{0.333}", "\\frac{1}{3}", true},
      // Mixed numbers: one line, a proper fraction part.
      {"4 4/9", "\\frac{40}{9}", true},
      {"11 6/6", "12", false},
      {"11 6/6", "11", false},
      {"11 7/6", "\\frac{73}{6}", false},
      {"11\n5/6", "\\frac{71}{6}", false},
      // Inline math does not span lines; display math does.
      {"Answer $ \n 9 \n $", "9", false},
      {"Answer \\( \n 9 \n \\)", "9", false},
      {"Answer \\[ \n 9 \n \\]", "9", true},
      // A final-answer statement after the last box is the later answer.
      {"so $\\boxed{200}$, then $\\boxed{255}$. Final Answer: The final answer is $10,455$. I hope it is correct.", "10455", true},
      {"so $\\boxed{200}$, then $\\boxed{255}$. Final Answer: The final answer is $10,455$. I hope it is correct.", "255", false},
      {"Thus \\boxed{5}. The final answer is correct.", "5", true},
      {"The final answer is 7, so \\boxed{8}", "8", true},
  };
  int failed = 0;
  for (const auto& c : cases) {
    bool got = math_response_correct(c.response, c.label);
    if (got != c.expected) ++failed;
    EXPECT_EQ(got, c.expected) << "response=[" << c.response << "] label=[" << c.label << "]";
  }
  std::printf("[responses] %zu cases, %d wrong\n", cases.size(), failed);
}

TEST(MathExtraction, Extractors) {
  auto ex = [](const char* text, std::vector<Extractor> order) {
    auto r = extract_answer(text, order);
    return r ? r->answer : std::string("<none>");
  };
  EXPECT_EQ(ex("a \\boxed{1} b \\boxed{\\frac{a}{b}} c", {Extractor::Boxed}), "\\frac{a}{b}");
  EXPECT_EQ(ex("\\boxed{{{x}}}", {Extractor::Boxed}), "{{x}}");
  EXPECT_EQ(ex("no box here", {Extractor::Boxed}), "<none>");
  EXPECT_EQ(ex("<answer> 5 </answer>", {Extractor::AnswerTag}), "5");
  EXPECT_EQ(ex("The answer is: 12.", {Extractor::AnswerIs}), "12");
  EXPECT_EQ(ex("ANSWER: 3.5", {Extractor::AnswerColon}), "3.5");
  EXPECT_EQ(ex("costs 5 then 7.25 total", {Extractor::LastNumber}), "7.25");
  EXPECT_EQ(ex("We find $x=2$ and then 3", {Extractor::LastMath}), "3");
  EXPECT_EQ(ex("We find 3 and then $x=2$", {Extractor::LastMath}), "x=2");
  EXPECT_EQ(ex("  whole text  ", {Extractor::Whole}), "whole text");
  // Order matters: the first extractor that finds something wins.
  EXPECT_EQ(ex("Answer: 4. \\boxed{5}", {Extractor::AnswerColon, Extractor::Boxed}), "4");
  EXPECT_EQ(ex("Answer: 4. \\boxed{5}", {Extractor::Boxed, Extractor::AnswerColon}), "5");
  EXPECT_EQ(ex("Answer: 4. Then \\boxed{5}", {Extractor::AnswerColon}), "4");
  EXPECT_TRUE(extractor_from_name("answer_tag").has_value());
  EXPECT_FALSE(extractor_from_name("regex").has_value());
  EXPECT_EQ(label_to_answer("The answer is $\\boxed{\\frac{1}{2}}$."), "\\frac{1}{2}");
  EXPECT_EQ(label_to_answer("$x = 5$"), "x = 5");
  EXPECT_EQ(strip_answer("$$ 5. $$"), "5");
  EXPECT_EQ(strip_answer("1, 2, 3, ..."), "1, 2, 3, ...");
}

TEST(MathVerifierReward, PolicyAndFailures) {
  RewardOptions o;
  o.type = "math";
  o.format_reward = 0.1;
  o.incorrect_reward = -1.0;
  MathVerifier v(o);
  auto good = v.score("so \\boxed{4}", "4");
  EXPECT_TRUE(good.correct);
  EXPECT_EQ(good.reward, 1.0);
  EXPECT_EQ(good.extracted, "4");
  EXPECT_FALSE(good.failed());
  auto wrong = v.score("so \\boxed{5}", "4");
  EXPECT_FALSE(wrong.correct);
  EXPECT_EQ(wrong.reward, 0.1);  // found but wrong: the format reward
  auto none = v.score("", "4");
  EXPECT_EQ(none.reward, -1.0);  // nothing found
  EXPECT_EQ(none.extracted, "");
  auto number_label = v.score("\\boxed{0.5}", 0.5);
  EXPECT_TRUE(number_label.correct);
  auto list_label = v.score("\\boxed{five}", nlohmann::json::array({"5", "five"}));
  EXPECT_TRUE(list_label.correct);
  auto bad = v.score("\\boxed{4}", nlohmann::json::object({{"x", 1}}));
  EXPECT_TRUE(bad.failed());
  EXPECT_EQ(bad.failure.rfind("bad_label", 0), 0u) << bad.failure;
  EXPECT_TRUE(std::isnan(bad.reward));
}

TEST(MathVerifierReward, ConfigurableExtractors) {
  RewardOptions o;
  o.extractors = {"answer_tag"};
  MathVerifier v(o);
  EXPECT_FALSE(v.score("\\boxed{4}", "4").correct);  // boxed is not enabled
  EXPECT_TRUE(v.score("<answer>4</answer>", "4").correct);
}

}  // namespace
}  // namespace lockstep::reward
